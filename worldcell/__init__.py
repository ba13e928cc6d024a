"""worldcell: the server side (the fleet) of a Workflow DevKit World.

Importing the package makes the Celery app available as ``worldcell.celery_app``
so ``@shared_task`` functions bind to it.
"""
from .celery import app as celery_app

__all__ = ["celery_app"]
