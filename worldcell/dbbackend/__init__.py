"""worldcell's database backends (``DATABASES["default"]["ENGINE"]``); see ``postgresql``."""
