"""Payload previews for humans: codec-encoded text rendered as readable, bounded HTML.

Payload columns (run input/output/error, step payloads, event bodies, hook
metadata, queue bodies, stream chunks) hold codec-encoded JSON text
(``worldcell.codec``, DESIGN.md rule 5). The admin shows them decoded:

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
"""
from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import BinaryField, F, Func, IntegerField, TextField, Value
from django.db.models.functions import Greatest, Substr
from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe

from . import codec

__all__ = [
    "BLOCK_HEAD_CHARS",
    "INLINE_HEAD_CHARS",
    "PartialBytes",
    "PartialDict",
    "PartialList",
    "PartialStr",
    "StoredSize",
    "StoredText",
    "binary_annotations",
    "format_size",
    "parse_json_prefix",
    "payload_annotations",
    "render_bytes",
    "render_payload",
    "render_queue_body",
    "render_structured_error",
    "render_value",
    "stored_text",
]

#: Characters of a payload column read for a full (block) preview.
BLOCK_HEAD_CHARS = 65_536
#: Characters read for a one-line preview in a table.
INLINE_HEAD_CHARS = 2_048
#: Characters read from the end (enough for a base64 tag's padding).
TAIL_CHARS = 8

#: Visible characters a block preview may print before it is cut.
BLOCK_BUDGET = 12_000
#: Visible characters of a one-line preview.
INLINE_BUDGET = 220

_BYTES_TAG_HEAD = '{"__type":"Uint8Array","data":"'
_BYTES_TAG_END = '"}'


# --------------------------------------------------------------------------- reading columns


class StoredSize(Func):
    """Length in bytes of a text or binary column, without reading a TOASTed value on PostgreSQL.

    PostgreSQL: ``OCTET_LENGTH`` (answered from the TOAST pointer); SQLite:
    ``LENGTH`` (characters for text, which equals bytes for ASCII codec text;
    bytes for a BLOB).
    """

    function = "LENGTH"
    output_field = IntegerField()

    def as_postgresql(self, compiler, connection, **extra):
        return self.as_sql(compiler, connection, function="OCTET_LENGTH", **extra)


class _BinaryHead(Func):
    """The first bytes of a binary column (``SUBSTR`` works on bytea and BLOB)."""

    function = "SUBSTR"

    def __init__(self, expression, length: int):
        super().__init__(expression, Value(1), Value(length), output_field=BinaryField())


def payload_annotations(field: str, *, head: int = BLOCK_HEAD_CHARS, tail: int = TAIL_CHARS) -> dict[str, Any]:
    """Queryset annotations that read a preview of the text column ``field`` instead of all of it.

    Adds ``pv_<field>_head`` (first ``head`` characters), ``pv_<field>_size``
    (stored bytes; NULL when the column is NULL = absent) and
    ``pv_<field>_tail`` (last ``tail`` characters). Combine with
    ``.defer(field)``; read back with ``stored_text(row, field)``.
    """
    size = StoredSize(F(field))
    return {
        f"pv_{field}_head": Substr(F(field), 1, head, output_field=TextField()),
        f"pv_{field}_size": size,
        f"pv_{field}_tail": Substr(F(field), Greatest(size - tail + 1, Value(1)), tail, output_field=TextField()),
    }


def binary_annotations(field: str, *, head: int = 64) -> dict[str, Any]:
    """Annotations ``pv_<field>_head`` (first ``head`` bytes) and ``pv_<field>_size`` of a binary column."""
    return {f"pv_{field}_head": _BinaryHead(F(field), head), f"pv_{field}_size": StoredSize(F(field))}


@dataclass(frozen=True)
class StoredText:
    """A stored codec text, or the part of it that was read.

    Attributes:
        head: the first characters (the whole text when ``complete``).
        size: the stored size in bytes (= characters: codec text is ASCII).
        tail: the last few characters ("" when not read).
    """

    head: str
    size: int
    tail: str = ""

    @property
    def complete(self) -> bool:
        return len(self.head) >= self.size

    @classmethod
    def whole(cls, text: str) -> "StoredText":
        return cls(text, len(text), text[-TAIL_CHARS:])


def stored_text(row: Any, field: str) -> StoredText | None:
    """The ``StoredText`` of ``field`` on a row annotated by ``payload_annotations`` (None = absent).

    Falls back to the loaded column value when the row was not annotated.
    """
    size = getattr(row, f"pv_{field}_size", _MISSING)
    if size is _MISSING:
        text = getattr(row, field)
        return None if text is None else StoredText.whole(text)
    if size is None:
        return None
    return StoredText(getattr(row, f"pv_{field}_head") or "", int(size), getattr(row, f"pv_{field}_tail") or "")


_MISSING = object()


# --------------------------------------------------------------------------- lenient prefix parsing


class PartialStr(str):
    """A JSON string cut by the end of the text that was read."""


class PartialDict(dict):
    """A JSON object cut by the end of the text: only its complete members."""


class PartialList(list):
    """A JSON array cut by the end of the text: only its complete items."""


@dataclass(frozen=True)
class PartialBytes:
    """The first bytes of a ``Uint8Array`` whose base64 text was cut; ``total`` = full size when known."""

    data: bytes
    total: int | None = None


class _Cut:
    """Marks where the text that was read ends inside a value."""

    def __repr__(self) -> str:
        return "…"


CUT = _Cut()

_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_STRING_RUN = re.compile(r'[^"\\\x00-\x1f]*')
_NUMBER_CHARS = re.compile(r"[-+0-9.eE]+")
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_MAX_DEPTH = 200


class _PrefixParser:
    """Recursive descent over JSON text that may stop anywhere (see ``parse_json_prefix``)."""

    def __init__(self, text: str):
        self.s = text
        self.n = len(text)
        self.i = 0
        self.cut = False

    def _ws(self) -> bool:
        """Skip whitespace; False (and mark the cut) at the end of the text."""
        s, i, n = self.s, self.i, self.n
        while i < n and s[i] in " \t\n\r":
            i += 1
        self.i = i
        if i >= n:
            self.cut = True
            return False
        return True

    def value(self, depth: int = 0) -> Any:
        if depth > _MAX_DEPTH:
            raise ValueError("nesting too deep")
        if not self._ws():
            return CUT
        c = self.s[self.i]
        if c == "{":
            return self._object(depth)
        if c == "[":
            return self._array(depth)
        if c == '"':
            return self._string()
        if c == "-" or c.isdigit():
            m = _NUMBER_CHARS.match(self.s, self.i)
            self.i = m.end()
            if self.i >= self.n:  # the digits may go on past what was read
                self.cut = True
                return CUT
            token = m.group()
            if not _NUMBER.fullmatch(token):
                raise ValueError(f"bad number at {m.start()}")
            return codec._parse_float(token) if any(x in token for x in ".eE") else int(token)
        for word, val in (("true", True), ("false", False), ("null", None)):
            if self.s.startswith(word, self.i):
                self.i += len(word)
                return val
            if word.startswith(self.s[self.i:]):
                self.i = self.n
                self.cut = True
                return CUT
        raise ValueError(f"unexpected {c!r} at {self.i}")

    def _object(self, depth: int) -> Any:
        self.i += 1
        out: dict[str, Any] = {}
        if not self._ws():
            return PartialDict(out)
        if self.s[self.i] == "}":
            self.i += 1
            return _revive(out)
        while True:
            if not self._ws():
                return PartialDict(out)
            if self.s[self.i] != '"':
                raise ValueError(f"expected a member name at {self.i}")
            key = self._string()
            if self.cut or not self._ws():
                return PartialDict(out)
            if self.s[self.i] != ":":
                raise ValueError(f"expected ':' at {self.i}")
            self.i += 1
            val = self.value(depth + 1)
            out[key] = val
            if self.cut:
                return _revive_partial(out)
            if not self._ws():
                return _revive_partial(out)
            c = self.s[self.i]
            self.i += 1
            if c == "}":
                return _revive(out)
            if c != ",":
                raise ValueError(f"expected ',' or '}}' at {self.i - 1}")

    def _array(self, depth: int) -> Any:
        self.i += 1
        out: list[Any] = []
        if not self._ws():
            return PartialList(out)
        if self.s[self.i] == "]":
            self.i += 1
            return out
        while True:
            val = self.value(depth + 1)
            if val is not CUT:
                out.append(val)
            if self.cut or not self._ws():
                return PartialList(out)
            c = self.s[self.i]
            self.i += 1
            if c == "]":
                return out
            if c != ",":
                raise ValueError(f"expected ',' or ']' at {self.i - 1}")

    def _string(self) -> str:
        s, n = self.s, self.n
        self.i += 1
        parts: list[str] = []
        surrogates = False
        while True:
            m = _STRING_RUN.match(s, self.i)
            parts.append(m.group())
            self.i = m.end()
            if self.i >= n:
                self.cut = True
                return PartialStr(_join(parts, surrogates))
            c = s[self.i]
            if c == '"':
                self.i += 1
                return _join(parts, surrogates)
            if c != "\\":
                raise ValueError(f"control character in string at {self.i}")
            if self.i + 1 >= n:
                self.cut = True
                self.i = n
                return PartialStr(_join(parts, surrogates))
            e = s[self.i + 1]
            if e == "u":
                digits = s[self.i + 2 : self.i + 6]
                if len(digits) < 4:
                    self.cut = True
                    self.i = n
                    return PartialStr(_join(parts, surrogates))
                code = int(digits, 16)
                surrogates = surrogates or 0xD800 <= code <= 0xDFFF
                parts.append(chr(code))
                self.i += 6
            elif e in _ESCAPES:
                parts.append(_ESCAPES[e])
                self.i += 2
            else:
                raise ValueError(f"bad escape at {self.i}")


def _join(parts: list[str], surrogates: bool) -> str:
    text = "".join(parts)
    if surrogates:  # pair up \ud83d\ude00 escapes; lone halves stay as they are
        text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
    return text


def _b64_prefix(data: str) -> bytes:
    """Decode the longest whole-quantum prefix of (possibly cut) base64 text."""
    data = re.sub(r"[\t\n\f\r ]", "", data).rstrip("=")
    data = data[: len(data) - len(data) % 4]
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return b""


def _revive_date_fields(obj: dict[str, Any]) -> None:
    """Untagged ISO strings under ``createdAt``/``updatedAt``/… become datetimes, as the codec does (§3.2)."""
    for key in codec.DATE_FIELDS.intersection(obj):
        value = obj[key]
        if isinstance(value, str) and not isinstance(value, PartialStr):
            parsed = codec.parse_date_string(value)
            if parsed is not None:
                obj[key] = parsed


def _revive(obj: dict[str, Any]) -> Any:
    """A complete object: codec tags become datetime/bytes, DATE_FIELDS strings become datetimes (§3.2)."""
    tag = obj.get("__type")
    if tag == "Date" and isinstance(obj.get("iso"), str):
        parsed = codec.parse_date_string(obj["iso"])
        if parsed is not None:
            return parsed
    elif tag == "Uint8Array" and isinstance(obj.get("data"), str):
        try:
            return codec._b64decode_lenient(obj["data"])
        except codec.DecodeError:
            return obj
    _revive_date_fields(obj)
    return obj


def _revive_partial(obj: dict[str, Any]) -> Any:
    """A cut object: a cut ``Uint8Array`` tag becomes ``PartialBytes``; anything else a ``PartialDict``."""
    if obj.get("__type") == "Uint8Array" and set(obj) <= {"__type", "data"}:
        data = obj.get("data")
        return PartialBytes(_b64_prefix(data) if isinstance(data, str) else b"")
    _revive_date_fields(obj)
    return PartialDict(obj)


def parse_json_prefix(text: str) -> tuple[Any, bool]:
    """Parse as much of the JSON ``text`` as is there; ``(value, complete)``.

    Values cut by the end of ``text`` come back as ``PartialStr`` /
    ``PartialDict`` / ``PartialList`` / ``PartialBytes`` (a cut
    ``Uint8Array`` tag), and ``CUT`` where not even a prefix of a value was
    read. Codec tags of complete objects are revived (Date -> datetime,
    Uint8Array -> bytes). Raises ValueError when the text is not JSON.
    """
    parser = _PrefixParser(text)
    value = parser.value()
    if not parser.cut:
        parser._ws()
        if not parser.cut:
            raise ValueError(f"extra data at {parser.i}")
        parser.cut = False
    return value, not parser.cut


# --------------------------------------------------------------------------- rendering


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
            self.bytes(bytes(v), len(v))
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

    def bytes(self, data: bytes, total: int | None) -> None:
        size = f"{total:,} bytes" if total is not None else f"≥ {len(data):,} bytes"
        self.emit(f"Uint8Array({size})", "wc-type")
        head = data[: self.preview_bytes]
        if not head:
            return
        more = total is None or len(head) < total
        text = _printable_text(head)
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
        partial = isinstance(v, PartialDict)
        if not v:
            self.emit("{")
            if partial:
                self.more("…")
            self.emit("}")
            return
        if depth >= self.max_depth:
            self.more("{…}")
            return
        self.emit("{")
        items = list(v.items())
        for n, (key, item) in enumerate(items[: self.max_items]):
            if self.exhausted:
                return
            self.newline(depth + 1)
            self.emit(_json_string(key), "wc-key")
            self.emit(": ")
            self.value(item, depth + 1)
            if n < len(items) - 1 or partial:
                self.emit(", " if self.inline else ",")
        if len(items) > self.max_items:
            self.newline(depth + 1)
            self.more(f"… {len(items) - self.max_items:,} more members")
        if partial:
            self.newline(depth + 1)
            self.more("… (cut)")
        self.newline(depth)
        self.emit("}")

    def sequence(self, v: list, depth: int) -> None:
        partial = isinstance(v, PartialList)
        if not v:
            self.emit("[")
            if partial:
                self.more("…")
            self.emit("]")
            return
        if depth >= self.max_depth:
            self.more("[…]")
            return
        self.emit("[")
        for n, item in enumerate(v[: self.max_items]):
            if self.exhausted:
                return
            self.newline(depth + 1)
            self.value(item, depth + 1)
            if n < len(v) - 1 or partial:
                self.emit(", " if self.inline else ",")
        if len(v) > self.max_items:
            self.newline(depth + 1)
            self.more(f"… {len(v) - self.max_items:,} more items")
        if partial:
            self.newline(depth + 1)
            self.more("… (cut)")
        self.newline(depth)
        self.emit("]")

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


def render_payload(stored: StoredText | str | None, *, inline: bool = False, budget: int | None = None) -> SafeString:
    """A stored payload column rendered for reading (see the module docstring).

    Args:
        stored: a ``StoredText`` (from ``stored_text``), the full stored text,
            or None for an absent payload (SQL NULL).
        inline: one line for tables (about ``INLINE_BUDGET`` characters),
            else a pretty-printed block (about ``BLOCK_BUDGET``).
        budget: visible characters before the preview is cut.

    Returns safe HTML. Text that is not valid codec JSON is shown raw.
    """
    if stored is None:
        return mark_safe('<span class="wc-absent">absent</span>')
    if isinstance(stored, str):
        stored = StoredText.whole(stored)
    r = _Renderer(inline, budget or (INLINE_BUDGET if inline else BLOCK_BUDGET))
    try:
        value, complete = _decode_stored(stored)
    except (ValueError, RecursionError):
        r.emit(stored.head[: r.budget], "wc-raw")
        return _wrap(r.html(), inline, _size_note(stored, True, inline))
    r.value(value)
    return _wrap(r.html(), inline, _size_note(stored, r.cut or not complete, inline))


#: Characters of an error stack shown before it is cut.
STACK_CHARS = 8_000


def render_structured_error(stored: StoredText | str | None) -> SafeString:
    """A stored StructuredError (``{message, stack?, code?}``, PROTOCOL.md §5.2) as people read errors.

    The code and message on one line, the stack as real lines below; any
    other value (upstream stores some errors verbatim) falls back to
    ``render_payload``.
    """
    if stored is None or isinstance(stored, str):
        stored = None if stored is None else StoredText.whole(stored)
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


def queue_body_value(stored: StoredText) -> tuple[Any, bool]:
    """The payload inside a stored queue body: ``(value, complete)``.

    A queue body is stored as the codec encoding of a *string* (the exact
    bytes to POST), which itself is shared-codec JSON (PROTOCOL.md §7.1,
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
            return _revive_tree(json.loads(outer)), True
        return parse_json_prefix(outer)[0], False
    except ValueError:
        return outer, complete


def _revive_tree(value: Any) -> Any:
    if isinstance(value, dict):
        return _revive({k: _revive_tree(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_revive_tree(v) for v in value]
    return value


def render_queue_body(stored: StoredText | str | None, *, inline: bool = False, budget: int | None = None) -> SafeString:
    """A stored queue message body rendered for reading (see ``queue_body_value``)."""
    if stored is None:
        return mark_safe('<span class="wc-absent">absent</span>')
    if isinstance(stored, str):
        stored = StoredText.whole(stored)
    r = _Renderer(inline, budget or (INLINE_BUDGET if inline else BLOCK_BUDGET))
    try:
        value, complete = queue_body_value(stored)
    except ValueError:
        return render_payload(stored, inline=inline)
    r.value(value)
    return _wrap(r.html(), inline, _size_note(stored, r.cut or not complete, inline))


def queue_body_run_id(stored: StoredText | str | None) -> str | None:
    """The run a queue body concerns (``runId`` of a workflow message, ``workflowRunId`` of a step message)."""
    if stored is None:
        return None
    if isinstance(stored, str):
        stored = StoredText.whole(stored)
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
