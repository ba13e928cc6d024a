"""The Celery application of the fleet.

Workers deliver queue messages; beat fires the queue cells' due alarms every
second (DESIGN.md "Delivery"). Configuration comes from Django settings keys
prefixed ``CELERY_`` (see ``worldcell.settings``).
"""
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "worldcell.settings")

app = Celery("worldcell")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
