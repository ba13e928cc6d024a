"""Operational state of the fleet itself (docs/operations.md "Health").

``Heartbeat`` keeps one row per periodic process: ``beat`` is touched by the
``fire_due_alarms`` task that Celery beat sends every second, so readiness
can tell that beat *and* a worker are running.
"""
from __future__ import annotations

from django.db import models

__all__ = ["Heartbeat"]


class Heartbeat(models.Model):
    """The last time (epoch ms) process ``name`` reported it was alive."""

    name = models.CharField(max_length=64, primary_key=True)
    at_ms = models.BigIntegerField(help_text="epoch ms of the last tick")

    class Meta:
        verbose_name = "heartbeat"

    def __str__(self) -> str:
        return self.name
