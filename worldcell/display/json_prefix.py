"""A lenient parser for the head of a JSON text that was cut: keeps what is complete, marks the cut.

``parse_json_prefix(text) -> (value, complete)``; cut values come back as
``PartialStr`` / ``PartialDict`` / ``PartialList`` / ``PartialBytes`` and
``CUT``. Codec tags of complete objects are revived as the wire codec does
(docs/protocol.md §3.2): ``revive_tree`` applies the same to parsed JSON.
"""
from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from typing import Any

from worldcell import codec

__all__ = ["CUT", "PartialBytes", "PartialDict", "PartialList", "PartialStr", "parse_json_prefix", "revive_tree"]


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


def revive_tree(value: Any) -> Any:
    """Plain parsed JSON with the codec's tags and DATE_FIELDS strings revived at every depth."""
    if isinstance(value, dict):
        return _revive({k: revive_tree(v) for k, v in value.items()})
    if isinstance(value, list):
        return [revive_tree(v) for v in value]
    return value
