from django.apps import AppConfig
from django.contrib.admin import apps as admin_apps


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


class ConsoleAdminConfig(admin_apps.AdminConfig):
    """``django.contrib.admin`` with the operator console's site as ``admin.site``.

    Listed in ``INSTALLED_APPS`` instead of ``django.contrib.admin`` (Django's
    documented way to override the default site).
    """

    default = False  # the ``worldcell`` app itself is WorldcellConfig
    default_site = "worldcell.admin_site.ConsoleSite"
