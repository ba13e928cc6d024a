"""The ``queue`` binding's cell service (docs/protocol.md §4.4, §7).

``QueueCell(name)`` is what the RPC router builds for ``/v1/rpc/queue/<name>/…``;
its methods are the six wire methods. They validate the arguments
(bad input is HTTP 400 ``ValidationError``, worldcell's policy) and call
``queueing.machine``, which reads ``now`` once per call, after locking the cell.

Length caps (UTF-8 bytes), checked before the database is touched: ids, keys
and names end up in btree indexes, whose entries PostgreSQL limits to about
2.7 KB — an over-long value would otherwise fail deep inside the transaction
(``index row size … exceeds btree maximum``) as a 500. The caps match the
other cells (``cells.index`` keys 2048, ``cells.streams`` names 1024) and are
far above anything the client sends (``msg_<ULID>``, ``q:<n>``, step ids):

=======================  =====  ==========================================
what                     bytes  why
=======================  =====  ==========================================
cell name                1024   unique index on ``QueueCell.name``
``messageId``            1024   unique (cell, id); dead-letter key ``dlq:<ms13>:<id>``
``idempotencyKey``       2048   unique (cell, key)
``queueName``            1024   sent as the ``x-vqs-queue-name`` header
``pathname``             1024   part of the delivery URL
``targetBaseUrl``        8192   the delivery URL
=======================  =====  ==========================================

A ``redriveDeadLetter`` id over the cap cannot name a dead letter:
``{"ok": false}``.
"""
from __future__ import annotations

import math
from typing import Any

from worldcell import metrics
from worldcell.errors import ValidationError
from worldcell.keys import require_storable as _storable
from worldcell.tenancy import DEFAULT_TENANT

from . import machine
from .runref import FLOW_QUEUE_PREFIX, run_of_message

__all__ = ["QueueCell"]

_INT32 = 2**31 - 1

CELL_NAME_MAX_BYTES = 1024
MESSAGE_ID_MAX_BYTES = 1024
IDEMPOTENCY_KEY_MAX_BYTES = 2048
QUEUE_NAME_MAX_BYTES = 1024
PATHNAME_MAX_BYTES = 1024
TARGET_BASE_URL_MAX_BYTES = 8192


def _string(obj: dict, key: str, field: str, *, optional: bool = False) -> str | None:
    value = obj.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise ValidationError(f"{field}: expected a string" + ("" if value is None else f", got {type(value).__name__}"))
    return value


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _integer(value: Any, field: str, *, minimum: int | None = None) -> int:
    if not _number(value) or value != int(value):
        raise ValidationError(f"{field}: expected an integer")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValidationError(f"{field}: must be >= {minimum}")
    return value


def parse_enqueue_request(request: Any) -> machine.EnqueueRequest:
    """Validate an ``enqueue`` request object (§7.3); raises ValidationError naming the field.

    Required strings: ``messageId``, ``queueName``, ``pathname``, ``body``,
    ``config.targetBaseUrl``; ``config.queueShards`` an integer; optional
    ``idempotencyKey`` (string) and ``delaySeconds`` (number, fractional and
    negative allowed). JSON null counts as absent for the optional members.
    """
    if not isinstance(request, dict):
        raise ValidationError("request: expected an object")
    cfg = request.get("config")
    if not isinstance(cfg, dict):
        raise ValidationError("request.config: expected an object")
    message_id = _storable(
        _string(request, "messageId", "request.messageId"), "request.messageId", MESSAGE_ID_MAX_BYTES
    )
    queue_name = _storable(
        _string(request, "queueName", "request.queueName"), "request.queueName", QUEUE_NAME_MAX_BYTES
    )
    pathname = _storable(_string(request, "pathname", "request.pathname"), "request.pathname", PATHNAME_MAX_BYTES)
    body = _string(request, "body", "request.body")
    base = _storable(
        _string(cfg, "targetBaseUrl", "request.config.targetBaseUrl"),
        "request.config.targetBaseUrl",
        TARGET_BASE_URL_MAX_BYTES,
    )
    shards = _integer(cfg.get("queueShards"), "request.config.queueShards")
    if abs(shards) > _INT32:
        raise ValidationError("request.config.queueShards: out of range")
    key = _string(request, "idempotencyKey", "request.idempotencyKey", optional=True)
    if key is not None:
        _storable(key, "request.idempotencyKey", IDEMPOTENCY_KEY_MAX_BYTES)
    delay = request.get("delaySeconds")
    if delay is not None and not _number(delay):
        raise ValidationError("request.delaySeconds: expected a number")
    run_id = run_of_message(queue_name, body)
    return machine.EnqueueRequest(
        message_id=message_id,
        queue_name=queue_name,
        pathname=pathname,
        body=body,
        target_base_url=base,
        queue_shards=shards,
        idempotency_key=key,
        delay_seconds=delay,
        run_id=run_id,
        fence=run_id is not None,
        record_flow=run_id is not None and queue_name.startswith(FLOW_QUEUE_PREFIX),
    )


class QueueCell:
    """One queue cell ``q:<n>`` as the RPC router sees it (binding ``queue``).

    Args:
        name: the decoded cell name (any string without U+0000 / lone surrogates,
            at most ``CELL_NAME_MAX_BYTES`` UTF-8 bytes).
    """

    def __init__(self, name: str, tenant: str = DEFAULT_TENANT):
        self.name = _storable(name, "cell name", CELL_NAME_MAX_BYTES)
        self.tenant = tenant

    def enqueue(self, request: Any = None) -> dict[str, Any]:
        """``enqueue([request])`` -> ``{"ok":true,"messageId","deduped"}`` or CONFIG_MISMATCH (§4.4, §7.3).

        A message of an expired run is refused with ``{"ok":false,"code":"RUN_EXPIRED",…}``
        and a stored workflow message is remembered for stuck-run repair
        (docs/lifecycle.md; ``cells.fence`` and ``cells.repair``): both inside the
        enqueue's own transaction (``EnqueueRequest.fence``, ``record_flow``), so
        on PostgreSQL the whole enqueue stays one round trip.
        """
        parsed = parse_enqueue_request(request)
        result = machine.enqueue(self.name, parsed)
        if result.get("ok"):
            metrics.record_enqueue(parsed.queue_name, bool(result.get("deduped")))
        return result

    def stats(self) -> dict[str, Any]:
        """``stats([])`` -> ``{"pending","inflight","deadLetters","alarmAt"}`` (§7.9)."""
        return machine.cell_stats(self.name)

    def list_dead_letters(self, params: Any = None) -> dict[str, Any]:
        """``listDeadLetters([params?])`` -> P4 page (§4.0): ``limit`` (default 100), ``cursor`` (full key)."""
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise ValidationError("params: expected an object")
        limit = params.get("limit")
        limit = 100 if limit is None else min(_integer(limit, "params.limit", minimum=0), _INT32)
        cursor = params.get("cursor")
        if cursor is not None:
            if not isinstance(cursor, str):
                raise ValidationError("params.cursor: expected a string")
            _storable(cursor, "params.cursor")
        return machine.list_dead_letters(self.name, limit, cursor)

    def redrive_dead_letter(self, message_id: Any = None, *, target_base_url: str | None = None) -> dict[str, bool]:
        """``redriveDeadLetter([messageId])`` -> ``{"ok":bool}`` (§7.9); unknown ids give ``{"ok":false}``.

        ``target_base_url`` (keyword only, never from the wire): the console's
        redrive to an edited URL, validated by ``queueing.operations.check_target_url``.
        """
        if not isinstance(message_id, str) or "\x00" in message_id:
            return {"ok": False}
        try:
            if len(message_id.encode("utf-8")) > MESSAGE_ID_MAX_BYTES:
                return {"ok": False}  # no message with such an id can exist
        except UnicodeEncodeError:
            return {"ok": False}
        return machine.redrive_dead_letter(self.name, message_id, target_base_url=target_base_url)

    def purge_dead_letters(self) -> dict[str, int]:
        """``purgeDeadLetters([])`` -> ``{"purged": n}`` (§7.9)."""
        return machine.purge_dead_letters(self.name)

    def rearm_alarm(self) -> dict[str, int | None]:
        """``rearmAlarm([])`` -> ``{"alarmAt": ms|null}`` (§7.9)."""
        return machine.rearm_alarm(self.name)
