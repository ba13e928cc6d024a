"""Operator actions on dead letters: redrive and purge, with a reason for everything refused (docs/protocol.md §7.9).

Redrive and purge-all go through the queue cell's own service
(``queueing.service.QueueCell``: ``redrive_dead_letter``,
``purge_dead_letters``), exactly what the ``queue`` RPC binding runs. The
wire protocol has no "purge these dead letters", so
``purge_selected_dead_letters`` adds it here with the same discipline as
every queue transition (docs/architecture.md rule 1): one transaction that first locks
the cell's row, and a driver wake-up registered for after the commit.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from django.db import transaction

from worldcell import clock

from . import wake
from .models import DeadLetter, Message, QueueCell
from .service import QueueCell as QueueCellService

__all__ = ["RedriveResult", "purge_all_dead_letters", "purge_selected_dead_letters", "redrive_dead_letters"]


@dataclass(frozen=True)
class RedriveResult:
    """The outcome of redriving one dead letter: ``ok`` and, when refused, why."""

    cell_name: str
    message_id: str
    ok: bool
    reason: str = ""


def _refusal_reason(cell_name: str, dead: DeadLetter) -> str:
    """Why ``redriveDeadLetter`` answered ``{"ok": false}`` for ``dead`` (it says no more than that)."""
    if not DeadLetter.objects.filter(pk=dead.pk).exists():
        return "it is no longer a dead letter (redriven or purged meanwhile)"
    if dead.idempotency_key:
        holder = (
            Message.objects.filter(cell__name=cell_name, idempotency_key=dead.idempotency_key)
            .exclude(message_id=dead.message_id)
            .values_list("message_id", flat=True)
            .first()
        )
        if holder is not None:
            return f"live message {holder} holds its idempotency key {dead.idempotency_key!r}"
    return "the queue cell refused it"


def redrive_dead_letters(dead_letters: Iterable[DeadLetter]) -> list[RedriveResult]:
    """Redrive each dead letter through ``QueueCell(cell).redrive_dead_letter(messageId)`` (§7.9).

    Each redrive is its own transaction: the message starts over (attempt 0,
    due now, the cell's alarm armed) and is delivered by the cell's driver.
    Refusals (another live message holds the idempotency key, the dead
    letter is gone) are returned with a reason; nothing raises for them.
    When two dead letters share a message id, the service redrives the
    oldest first (key order), as upstream does.
    """
    results: list[RedriveResult] = []
    for dead in dead_letters:
        name = dead.cell.name
        outcome = QueueCellService(name).redrive_dead_letter(dead.message_id)
        if outcome.get("ok"):
            results.append(RedriveResult(name, dead.message_id, True))
        else:
            results.append(RedriveResult(name, dead.message_id, False, _refusal_reason(name, dead)))
    return results


def purge_selected_dead_letters(cell_name: str, dlq_keys: Iterable[str]) -> int:
    """Delete the dead letters of cell ``cell_name`` whose ``dlq:`` keys are given; returns how many went.

    One transaction that locks the cell's row first (like every queue
    transition), so it never interleaves with a dead-lettering, a redrive or
    a purge of the same cell. Keys that are already gone are skipped. The
    cell's driver is woken on commit, as after every transition that held
    the lock (a wake-up that found the cell locked relies on it).
    """
    keys = list(dlq_keys)
    if not keys:
        return 0
    with transaction.atomic():
        cell = QueueCell.objects.select_for_update().filter(name=cell_name).first()
        if cell is None:
            return 0
        now = clock.now_ms()
        purged, _ = DeadLetter.objects.filter(cell=cell, dlq_key__in=keys).delete()
        name, alarm_at = cell.name, cell.alarm_at
        transaction.on_commit(lambda: wake.after_transition(name, alarm_at, now), robust=True)
    return purged


def purge_all_dead_letters(cell_names: Iterable[str]) -> dict[str, int]:
    """``purgeDeadLetters()`` on each named cell (§7.9); ``{cell name: purged count}``."""
    return {name: QueueCellService(name).purge_dead_letters()["purged"] for name in cell_names}
