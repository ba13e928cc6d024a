"""Payload previews for humans: codec-encoded text rendered as readable, bounded HTML.

Payload columns (run input/output/error, step payloads, event bodies, hook
metadata, queue bodies, stream chunks) hold codec-encoded JSON text
(``worldcell.codec``, docs/architecture.md rule 5). The admin shows them decoded:

* JSON pretty-printed (or on one line for tables), strings JSON-escaped so
  U+0000 and lone surrogates stay visible as ``\\u0000`` / ``\\ud800``;
* Dates as ``Date 2026-01-02T03:04:05.678Z``;
* bytes (``Uint8Array`` tags) as their size plus a UTF-8 text preview when
  they hold text, else a hex dump of the first bytes;
* everything bounded: long strings, big arrays and deep nesting are cut with
  an explicit ``…`` and the stored size is always shown.

A 5 MB payload is never read whole. ``payload_annotations`` asks the
database for the first N characters, the stored size and the last few
characters of a column; ``render_payload`` decodes a complete text exactly
(``codec.decode``) and parses an incomplete head with a lenient prefix
parser (``parse_json_prefix``) that keeps whatever was complete and marks
the cut. Codec text is pure ASCII, so characters = bytes.

Modules, by job: ``columns`` (bounded reads of a column: queryset
annotations and ``StoredText``), ``json_prefix`` (the lenient parser),
``html`` (the renderer), ``queue_body`` (queue message bodies, a string of
shared-codec JSON inside a codec string). The console imports this package
(``from worldcell import display``); the names below are its public face.
"""
from .columns import (
    BLOCK_HEAD_CHARS,
    INLINE_HEAD_CHARS,
    TAIL_CHARS,
    StoredSize,
    StoredText,
    as_stored,
    binary_annotations,
    payload_annotations,
    stored_text,
)
from .html import (
    BLOCK_BUDGET,
    INLINE_BUDGET,
    STACK_CHARS,
    absent,
    format_size,
    render_bytes,
    render_decoded,
    render_payload,
    render_structured_error,
    render_value,
)
from .json_prefix import CUT, PartialBytes, PartialDict, PartialList, PartialStr, parse_json_prefix, revive_tree
from .queue_body import queue_body_run_id, queue_body_value, render_queue_body

__all__ = [
    "BLOCK_BUDGET",
    "BLOCK_HEAD_CHARS",
    "CUT",
    "INLINE_BUDGET",
    "INLINE_HEAD_CHARS",
    "PartialBytes",
    "PartialDict",
    "PartialList",
    "PartialStr",
    "STACK_CHARS",
    "StoredSize",
    "StoredText",
    "TAIL_CHARS",
    "absent",
    "as_stored",
    "binary_annotations",
    "format_size",
    "parse_json_prefix",
    "payload_annotations",
    "queue_body_run_id",
    "queue_body_value",
    "render_bytes",
    "render_decoded",
    "render_payload",
    "render_queue_body",
    "render_structured_error",
    "render_value",
    "revive_tree",
    "stored_text",
]
