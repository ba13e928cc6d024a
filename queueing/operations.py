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

__all__ = ["RedriveResult", "check_target_url", "purge_all_dead_letters", "purge_selected_dead_letters",
           "redrive_dead_letters", "redrive_to_url"]


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


def check_target_url(text: str) -> tuple[str | None, str]:
    """``(the URL, "")`` when ``text`` can be a message's target base URL, else ``(None, why)``.

    A target base URL is absolute ``http`` or ``https`` with a host
    (deliveries POST to ``<it>/.well-known/workflow/v1/<pathname>``,
    protocol.md §7.11), no query or fragment, no user name or password, storable text of at most
    ``TARGET_BASE_URL_MAX_BYTES`` bytes; surrounding blanks are dropped.
    """
    from urllib.parse import urlsplit

    from worldcell.keys import storable_text

    from .service import TARGET_BASE_URL_MAX_BYTES

    url = (text or "").strip()
    if not url:
        return None, "enter a URL"
    if not storable_text(url) or any(c.isspace() or ord(c) < 32 for c in url):
        return None, "the URL contains spaces or control characters"
    if len(url.encode("utf-8")) > TARGET_BASE_URL_MAX_BYTES:
        return None, f"the URL is longer than {TARGET_BASE_URL_MAX_BYTES} bytes"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError as exc:
        return None, f"not a valid URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return None, "the URL must start with http:// or https://"
    if not parts.hostname:
        return None, "the URL must name a host (an absolute URL such as https://app.example.com)"
    if parts.query or parts.fragment or "?" in url or "#" in url:
        return None, "a target base URL has no query or fragment"
    if "@" in parts.netloc:
        return None, ("a URL with a user name or password is not accepted here: it would be shown on "
                      "the confirmation page and written to the admin log")
    return url, ""


def redrive_to_url(dead: DeadLetter, target_base_url: str) -> RedriveResult:
    """Redrive ``dead`` (a ``DeadLetter`` with its cell) to ``target_base_url`` instead of its own target.

    The URL is checked first (``check_target_url``; refused: nothing
    changes). Then the queue machine's redrive (one transaction, the cell
    locked) with the new target on the message — this message only; the
    cell's other messages and the app's later enqueues keep theirs.
    """
    url, why = check_target_url(target_base_url)
    name = dead.cell.name
    if url is None:
        return RedriveResult(name, dead.message_id, False, f"invalid target URL: {why}")
    outcome = QueueCellService(name).redrive_dead_letter(dead.message_id, target_base_url=url)
    if outcome.get("ok"):
        return RedriveResult(name, dead.message_id, True)
    return RedriveResult(name, dead.message_id, False, _refusal_reason(name, dead))


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
