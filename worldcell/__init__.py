"""worldcell: the server side (the fleet) of a Workflow DevKit World.

Importing the package loads nothing: the pure wire codec (``worldcell.codec``)
is importable without Django or Celery (``worldcell_client`` relies on it).
The Celery app (``worldcell.celery.app``) is created when Django starts
(``WorldcellConfig.ready``) so ``@shared_task`` functions bind to it, and
``celery -A worldcell`` finds it in the ``worldcell.celery`` module.
"""
