from django.apps import AppConfig


class QueueingConfig(AppConfig):
    """Registers the ``queue`` binding with the dispatch table and the Celery driver with ``queueing.wake``."""

    name = "queueing"
    verbose_name = "Queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import bindings  # noqa: F401  (registers the binding)
        from . import tasks, wake

        # The composition root: the state machine wakes cells through ``wake``,
        # which reaches Celery through what is registered here (no import of
        # the driver from inside the queue, docs/architecture.md "Delivery").
        wake.register_broker(tasks.send_wake)
