"""HTML rendering of decoded payloads: pretty or one-line, bounded, honest about what it leaves out.

``render_payload`` (a stored codec text), ``render_value`` (a decoded
value), ``render_bytes`` (a chunk's head), ``render_structured_error``
(``{message, stack?, code?}``) and ``render_decoded`` (a value decoded by the
caller, with the stored size note). Every result is safe HTML.
"""
from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe

from worldcell import codec

from .columns import StoredText, as_stored
from .json_prefix import CUT, PartialBytes, PartialDict, PartialList, PartialStr, parse_json_prefix

__all__ = [
    "BLOCK_BUDGET",
    "INLINE_BUDGET",
    "absent",
    "format_size",
    "render_bytes",
    "render_decoded",
    "render_payload",
    "render_structured_error",
    "render_value",
]

#: Visible characters a block preview may print before it is cut.
BLOCK_BUDGET = 12_000
#: Visible characters of a one-line preview.
INLINE_BUDGET = 220

_BYTES_TAG_HEAD = '{"__type":"Uint8Array","data":"'
_BYTES_TAG_END = '"}'


#: Bytes shown whole in a one-line preview / a block preview (longer: the first 24 / 96 bytes).
SHORT_INLINE_BYTES = 160
SHORT_BLOCK_BYTES = 4_096
_NOT_JSON = object()


def format_size(n: int | None) -> str:
    """``n`` bytes for humans: ``812 B``, ``4.1 KB``, ``5.0 MB`` (1 KB = 1024 B)."""
    if n is None:
        return "?"
    if n < 1024:
        return f"{n:,} B"
    for unit in ("KB", "MB", "GB"):
        n /= 1024
        if n < 1024 or unit == "GB":
            return f"{n:,.1f} {unit}"
    return f"{n:,.1f} GB"  # pragma: no cover


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _json_string(text: str) -> str:
    """``text`` as a JSON string literal (control chars and lone surrogates escaped, the rest readable)."""
    out = json.dumps(text, ensure_ascii=False)
    return _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", out)


def _printable_text(data: bytes) -> str | None:
    """``data`` as text when it is UTF-8 (a multi-byte character cut at the end is allowed) and readable."""
    for trim in range(0, 4):
        try:
            text = data[: len(data) - trim].decode("utf-8")
            break
        except UnicodeDecodeError:
            continue
    else:
        return None
    if not text and data:
        return None
    readable = sum(1 for ch in text if ch.isprintable() or ch in "\n\r\t")
    return text if readable >= len(text) * 0.95 else None


class _Renderer:
    """Writes one value as HTML under a budget of visible characters."""

    def __init__(self, inline: bool, budget: int):
        self.inline = inline
        self.budget = budget
        self.max_string = 120 if inline else 2_000
        self.max_items = 8 if inline else 200
        self.max_depth = 6 if inline else 24
        self.preview_bytes = 24 if inline else 96
        # bytes up to this size are shown whole (and as JSON when they hold JSON text)
        self.whole_bytes = SHORT_INLINE_BYTES if inline else SHORT_BLOCK_BYTES
        self.parts: list[str] = []
        self.used = 0
        self.exhausted = False
        self.cut = False  # anything left out

    def emit(self, text: str, css: str | None = None) -> None:
        if self.exhausted:
            return
        room = self.budget - self.used
        if len(text) > room:
            text = text[: max(room, 0)]
            self.exhausted = True
            self.cut = True
        self.used += len(text)
        html = escape(text)
        self.parts.append(f'<span class="{css}">{html}</span>' if css else str(html))
        if self.exhausted:
            self.parts.append('<span class="wc-cut">…</span>')

    def newline(self, depth: int) -> None:
        if self.inline:
            return
        self.emit("\n" + "  " * depth)

    def more(self, text: str) -> None:
        """A marker of something left out; printed whole (it does not count against the budget)."""
        self.cut = True
        if not self.exhausted:
            self.parts.append(f'<span class="wc-cut">{escape(text)}</span>')

    def value(self, v: Any, depth: int = 0) -> None:
        if self.exhausted:
            return
        if v is CUT:
            self.more("…")
        elif v is None:
            self.emit("null", "wc-lit")
        elif v is True or v is False:
            self.emit("true" if v else "false", "wc-lit")
        elif isinstance(v, (int, float)):
            self.emit(json.dumps(v), "wc-num")
        elif isinstance(v, str):
            self.string(v)
        elif isinstance(v, datetime):
            self.emit("Date ", "wc-type")
            self.emit(codec.format_iso(v), "wc-date")
        elif isinstance(v, (bytes, bytearray, memoryview)):
            self.bytes(bytes(v), len(v), depth)
        elif isinstance(v, PartialBytes):
            self.bytes(v.data, v.total)
        elif isinstance(v, dict):
            self.mapping(v, depth)
        elif isinstance(v, (list, tuple)):
            self.sequence(v, depth)
        else:
            self.emit(repr(v))

    def string(self, v: str) -> None:
        partial = isinstance(v, PartialStr)
        shown = v[: self.max_string]
        literal = _json_string(shown)
        if len(v) > len(shown) or partial:
            literal = literal[:-1]  # leave the string open: it goes on
        self.emit(literal, "wc-str")
        if len(v) > len(shown):
            self.more(f"… (+{len(v) - len(shown):,}{'+' if partial else ''} chars)")
        elif partial:
            self.more("… (cut)")

    def bytes(self, data: bytes, total: int | None, depth: int = 0) -> None:
        """A ``Uint8Array``: its size, then its content as JSON, UTF-8 text or hex.

        Bytes up to ``whole_bytes`` that are all present are shown whole; when
        they are UTF-8 JSON text (an object, array or string) they are decoded
        and drawn like any other value (``json``), else as text (``utf-8``) or
        a hex dump; a longer value shows its first ``preview_bytes``.
        """
        size = f"{total:,} bytes" if total is not None else f"≥ {len(data):,} bytes"
        self.emit(f"Uint8Array({size})", "wc-type")
        whole = total is not None and len(data) >= total and total <= self.whole_bytes
        head = data if whole else data[: self.preview_bytes]
        if not head:
            return
        more = not whole and (total is None or len(head) < total)
        text = _printable_text(head)
        if whole and text is not None and text.lstrip()[:1] in ("{", "[", '"'):
            try:
                parsed = json.loads(text)
            except ValueError:
                parsed = _NOT_JSON
            if parsed is not _NOT_JSON:
                self.emit(" json ", "wc-type")
                self.value(parsed, depth)
                return
        if text is not None:
            literal = _json_string(text)
            self.emit(" utf-8 ", "wc-type")
            self.emit(literal[:-1] if more else literal, "wc-str")
        else:
            self.emit(" hex ", "wc-type")
            self.emit(head.hex(" "), "wc-hex")
        if more:
            self.more(" …")

    def mapping(self, v: dict, depth: int) -> None:
        self.container("{", "}", list(v.items()), isinstance(v, PartialDict), depth, "members")

    def sequence(self, v: list, depth: int) -> None:
        self.container("[", "]", [(None, item) for item in v], isinstance(v, PartialList), depth, "items")

    def container(
        self, opening: str, closing: str, entries: list[tuple[str | None, Any]], partial: bool, depth: int, noun: str
    ) -> None:
        """An object (entries ``(key, value)``) or an array (keys None), cut at ``max_items`` / ``max_depth``."""
        if not entries:
            self.emit(opening)
            if partial:
                self.more("…")
            self.emit(closing)
            return
        if depth >= self.max_depth:
            self.more(f"{opening}…{closing}")
            return
        self.emit(opening)
        for n, (key, item) in enumerate(entries[: self.max_items]):
            if self.exhausted:
                return
            self.newline(depth + 1)
            if key is not None:
                self.emit(_json_string(key), "wc-key")
                self.emit(": ")
            self.value(item, depth + 1)
            if n < len(entries) - 1 or partial:
                self.emit(", " if self.inline else ",")
        if len(entries) > self.max_items:
            self.newline(depth + 1)
            self.more(f"… {len(entries) - self.max_items:,} more {noun}")
        if partial:
            self.newline(depth + 1)
            self.more("… (cut)")
        self.newline(depth)
        self.emit(closing)

    def html(self) -> str:
        return "".join(self.parts)


def _wrap(body: str, inline: bool, meta: str = "") -> SafeString:
    if inline:
        return mark_safe(f'<span class="wc-inline">{body}</span>{meta}')
    return mark_safe(f'<pre class="wc-payload">{body}</pre>{meta}')


def render_value(value: Any, *, inline: bool = False, budget: int | None = None) -> SafeString:
    """A decoded value (as ``codec.decode`` returns it) rendered as bounded HTML."""
    r = _Renderer(inline, budget or (INLINE_BUDGET if inline else BLOCK_BUDGET))
    r.value(value)
    return _wrap(r.html(), inline)


def render_bytes(data: bytes | None, total: int | None = None, *, inline: bool = True) -> SafeString:
    """A chunk of bytes (maybe only its head): size, then UTF-8 text or hex."""
    if data is None:
        return mark_safe('<span class="wc-absent">—</span>')
    total = len(data) if total is None else total
    r = _Renderer(inline, INLINE_BUDGET if inline else BLOCK_BUDGET)
    r.bytes(bytes(data), total)
    return _wrap(r.html(), inline)


def _decode_stored(stored: StoredText) -> tuple[Any, bool]:
    """The value of a stored text: exact when complete, else the lenient prefix parse."""
    if stored.complete:
        return codec.decode(stored.head), True
    value, complete = parse_json_prefix(stored.head)
    if isinstance(value, PartialBytes) and stored.head.startswith(_BYTES_TAG_HEAD) and stored.tail.endswith(_BYTES_TAG_END):
        # one big Uint8Array: its size follows from the stored size and the padding
        b64_len = stored.size - len(_BYTES_TAG_HEAD) - len(_BYTES_TAG_END)
        padding = len(stored.tail[: -len(_BYTES_TAG_END)]) - len(stored.tail[: -len(_BYTES_TAG_END)].rstrip("="))
        value = PartialBytes(value.data, b64_len * 3 // 4 - padding)
    return value, complete


def _size_note(stored: StoredText, cut: bool, inline: bool) -> str:
    if inline:
        if not (cut or not stored.complete):
            return ""
        return format_html(' <span class="wc-size">· {}</span>', format_size(stored.size))
    if stored.complete and not cut:
        return format_html('<div class="wc-size">{} stored</div>', format_size(stored.size))
    return format_html(
        '<div class="wc-size">{} stored ({} bytes) — preview truncated</div>', format_size(stored.size), f"{stored.size:,}"
    )


def absent() -> SafeString:
    """The mark of an absent payload (SQL NULL)."""
    return mark_safe('<span class="wc-absent">absent</span>')


def render_decoded(
    stored: StoredText, value: Any, complete: bool, *, inline: bool = False, budget: int | None = None
) -> SafeString:
    """``value``, decoded by the caller from ``stored`` (``complete`` False = only a prefix), with the size note."""
    r = _Renderer(inline, budget or (INLINE_BUDGET if inline else BLOCK_BUDGET))
    r.value(value)
    return _wrap(r.html(), inline, _size_note(stored, r.cut or not complete, inline))


def render_payload(stored: StoredText | str | None, *, inline: bool = False, budget: int | None = None) -> SafeString:
    """A stored payload column rendered for reading (see ``worldcell.display``).

    Args:
        stored: a ``StoredText`` (from ``stored_text``), the full stored text,
            or None for an absent payload (SQL NULL).
        inline: one line for tables (about ``INLINE_BUDGET`` characters),
            else a pretty-printed block (about ``BLOCK_BUDGET``).
        budget: visible characters before the preview is cut.

    Returns safe HTML. Text that is not valid codec JSON is shown raw.
    """
    stored = as_stored(stored)
    if stored is None:
        return absent()
    try:
        value, complete = _decode_stored(stored)
    except (ValueError, RecursionError):
        r = _Renderer(inline, budget or (INLINE_BUDGET if inline else BLOCK_BUDGET))
        r.emit(stored.head[: r.budget], "wc-raw")
        return _wrap(r.html(), inline, _size_note(stored, True, inline))
    return render_decoded(stored, value, complete, inline=inline, budget=budget)


#: Characters of an error stack shown before it is cut.
STACK_CHARS = 8_000


def render_structured_error(stored: StoredText | str | None) -> SafeString:
    """A stored StructuredError (``{message, stack?, code?}``, docs/protocol.md §5.2) as people read errors.

    The code and message on one line, the stack as real lines below; any
    other value (upstream stores some errors verbatim) falls back to
    ``render_payload``.
    """
    stored = as_stored(stored)
    if stored is None or not stored.complete:
        return render_payload(stored)
    try:
        value = codec.decode(stored.head)
    except ValueError:
        return render_payload(stored)
    if not (isinstance(value, dict) and isinstance(value.get("message"), str) and set(value) <= {"message", "stack", "code"}):
        return render_payload(stored)
    message = value["message"]
    parts = [format_html('<div class="wc-errline">{}<span class="wc-errmsg">{}</span>{}</div>',
                         format_html('<code class="wc-code">{}</code> ', value["code"]) if isinstance(value.get("code"), str) else "",
                         message[:STACK_CHARS],
                         format_html('<span class="wc-cut"> … (+{} chars)</span>', f"{len(message) - STACK_CHARS:,}") if len(message) > STACK_CHARS else "")]
    stack = value.get("stack")
    if isinstance(stack, str):
        cut = format_html('<span class="wc-cut">\n… (+{} chars)</span>', f"{len(stack) - STACK_CHARS:,}") if len(stack) > STACK_CHARS else ""
        parts.append(format_html('<pre class="wc-stack">{}{}</pre>', _LONE_SURROGATE.sub("\ufffd", stack[:STACK_CHARS]), cut))
    parts.append(_size_note(stored, False, False))
    return mark_safe("".join(str(p) for p in parts))

