from django.apps import AppConfig


class WorldcellConfig(AppConfig):
    """The project package as an app: it carries the devfleet and benchmark commands.

    ``ready()`` creates the Celery app (``worldcell.celery``) in every Django
    process, so ``@shared_task`` functions bind to it (docs/architecture.md
    "Delivery").
    """

    name = "worldcell"
    verbose_name = "worldcell"

    def ready(self) -> None:
        from . import celery  # noqa: F401  (creates and sets the current Celery app)
