from django.apps import AppConfig


class QueueingConfig(AppConfig):
    """Registers the ``queue`` binding with the dispatch table."""

    name = "queueing"
    verbose_name = "Queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import bindings  # noqa: F401  (registers the binding)
