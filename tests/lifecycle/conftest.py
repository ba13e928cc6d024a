"""Fixtures of the lifecycle tests."""
import pytest


@pytest.fixture(autouse=True)
def no_celery_wakeups(settings):
    """No Celery wake-ups from this process: the transactional tests here commit, and a
    wake-up sent on commit would open this process's Celery producer on the default
    broker (which the Celery tests later point elsewhere). Nothing here needs delivery."""
    settings.WORLDCELL_USE_CELERY = False
