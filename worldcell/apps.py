from django.apps import AppConfig


class WorldcellConfig(AppConfig):
    """The project package as an app: it carries the devfleet and benchmark commands."""

    name = "worldcell"
    verbose_name = "worldcell"
