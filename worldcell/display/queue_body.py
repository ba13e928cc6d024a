"""Previews of stored queue message bodies (docs/protocol.md §7.1, §3.3).

A body is stored as the codec encoding of a *string* (the exact bytes the
fleet POSTs), and that string is itself the client's shared-codec JSON.
"""
from __future__ import annotations

import json
from typing import Any

from django.utils.safestring import SafeString

from worldcell import codec

from .columns import StoredText, as_stored
from .html import absent, render_decoded, render_payload
from .json_prefix import PartialStr, parse_json_prefix, revive_tree

__all__ = ["queue_body_run_id", "queue_body_value", "render_queue_body"]


def queue_body_value(stored: StoredText) -> tuple[Any, bool]:
    """The payload inside a stored queue body: ``(value, complete)``.

    A queue body is stored as the codec encoding of a *string* (the exact
    bytes to POST), which itself is shared-codec JSON (docs/protocol.md §7.1,
    §3.3). Returns the parsed inner JSON (tags revived), or the body string
    itself when it is not JSON. Raises ValueError when the stored text is
    not a JSON string.
    """
    outer, outer_complete = (codec.decode(stored.head), True) if stored.complete else parse_json_prefix(stored.head)
    if not isinstance(outer, str):
        raise ValueError("not a stored body string")
    complete = outer_complete and not isinstance(outer, PartialStr)
    try:
        if complete:
            return revive_tree(json.loads(outer)), True
        return parse_json_prefix(outer)[0], False
    except ValueError:
        return outer, complete


def render_queue_body(stored: StoredText | str | None, *, inline: bool = False, budget: int | None = None) -> SafeString:
    """A stored queue message body rendered for reading (see ``queue_body_value``)."""
    stored = as_stored(stored)
    if stored is None:
        return absent()
    try:
        value, complete = queue_body_value(stored)
    except ValueError:
        return render_payload(stored, inline=inline)
    return render_decoded(stored, value, complete, inline=inline, budget=budget)


def queue_body_run_id(stored: StoredText | str | None) -> str | None:
    """The run a queue body concerns (``runId`` of a workflow message, ``workflowRunId`` of a step message)."""
    stored = as_stored(stored)
    if stored is None:
        return None
    try:
        value, _ = queue_body_value(stored)
    except ValueError:
        return None
    if isinstance(value, dict):
        for key in ("runId", "workflowRunId"):
            run_id = value.get(key)
            if isinstance(run_id, str) and not isinstance(run_id, PartialStr):
                return run_id
    return None

