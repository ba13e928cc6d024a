"""WSGI entry points.

* ``application`` — the Django WSGI app (gunicorn ``worldcell.wsgi:application``, the dev
  fleet's in-process waitress).
* ``checked_application()`` — a factory for the production API command
  (``waitress-serve --call worldcell.wsgi:checked_application``): it first runs the
  configuration check of ``worldcell.startup`` (one line on stderr and exit status 2 when,
  e.g., ``DATABASE_URL`` names a missing database or ``WORLD_SECRET`` is unset;
  docs/operations.md "Processes"), then returns ``application``. gunicorn runs the same
  check from ``worldcell/gunicorn_conf.py``.
"""
import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "worldcell.settings")

application = get_wsgi_application()


def checked_application():
    """The production API's app, after ``worldcell.startup.exit_if_misconfigured("api")``."""
    from worldcell.startup import exit_if_misconfigured

    exit_if_misconfigured("api")
    return application
