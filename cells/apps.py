from django.apps import AppConfig


class CellsConfig(AppConfig):
    """Registers the ``runs``, ``index`` and ``streams`` bindings with the dispatch table."""

    name = "cells"
    verbose_name = "Workflow runs, index and streams"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import bindings  # noqa: F401  (registers the bindings)
