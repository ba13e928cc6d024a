"""WSGI entry point (gunicorn ``worldcell.wsgi:application``, waitress in the dev fleet)."""
import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "worldcell.settings")

application = get_wsgi_application()
