"""The Celery application of the fleet.

Workers deliver queue messages; beat fires the queue cells' due alarms every
second (docs/architecture.md "Delivery"). Configuration comes from Django settings keys
prefixed ``CELERY_`` (see ``worldcell.settings``).
"""
import os
import sys

from celery import Celery
from celery.signals import beat_init, worker_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "worldcell.settings")


def _started_by_the_celery_command() -> bool:
    """True in a ``celery -A worldcell worker|beat`` process (not a worker embedded in tests)."""
    return os.path.basename(sys.argv[0]) in ("celery", "celery.exe") or sys.argv[0].endswith("celery/__main__.py")


if _started_by_the_celery_command():
    # Celery reads the settings before worker_init/beat_init fire: an invalid one is reported
    # here as one line and exit status 2 (docs/operations.md "Processes"), not as a traceback
    from .startup import exit_if_beat_schedule_unusable, exit_if_settings_invalid

    _role = "beat" if "beat" in sys.argv[1:] else "worker"
    exit_if_settings_invalid(_role)
    if _role == "beat":
        exit_if_beat_schedule_unusable(sys.argv[1:])

app = Celery("worldcell")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_init.connect
def _check_worker_configuration(**kwargs) -> None:
    """A bad configuration stops the worker with one line and exit status 2 (``worldcell.startup``)."""
    if _started_by_the_celery_command():
        from .startup import exit_if_misconfigured

        exit_if_misconfigured("worker")


@beat_init.connect
def _check_beat_configuration(**kwargs) -> None:
    if _started_by_the_celery_command():
        from .startup import exit_if_misconfigured

        exit_if_misconfigured("beat")
