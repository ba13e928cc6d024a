"""Pure helpers of the world-celld client's side of the wire (no Django, no Celery).

ids (``ulid``), cell-name escaping (``encode_uri_component``), queue shard
selection (``shard_for``), 13-digit epoch-ms key parts (``ms13``) and the
client's *shared* codec for strings it stores (``shared_codec_dumps``).
Sections: docs/protocol.md §0, §3.3, §6.1, §7.11.
"""
from __future__ import annotations

import base64
import json
import os
import time
from datetime import datetime
from typing import Any
from urllib.parse import quote

from worldcell import codec

__all__ = ["encode_uri_component", "ms13", "shard_for", "shared_codec_dumps", "ulid"]

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def ulid() -> str:
    """A new ULID: 48-bit millisecond time + 80 random bits, Crockford base32 (26 chars)."""
    value = (time.time_ns() // 1_000_000) << 80 | int.from_bytes(os.urandom(10), "big")
    out = []
    for _ in range(26):
        out.append(_CROCKFORD[value & 31])
        value >>= 5
    return "".join(reversed(out))


def encode_uri_component(text: str) -> str:
    """JavaScript ``encodeURIComponent`` (docs/protocol.md §6.1)."""
    return quote(text, safe="-_.!~*'()")


def shard_for(key: str, shards: int) -> int:
    """The queue shard of ``key``: FNV-1a over UTF-16 code units mod ``shards`` (docs/protocol.md §7.11)."""
    if shards <= 1:
        return 0
    h = 0x811C9DC5
    data = key.encode("utf-16-le", "surrogatepass")
    for i in range(0, len(data), 2):
        h ^= data[i] | (data[i + 1] << 8)
        h = (h * 0x01000193) & 0xFFFFFFFF
    return h % shards


def ms13(ms: int) -> str:
    """Epoch milliseconds (negative -> 0) left-padded to 13 digits (docs/protocol.md §0)."""
    return str(max(0, int(ms))).zfill(13)


def shared_codec_dumps(value: Any) -> str:
    """The client's *shared* codec (docs/protocol.md §3.3): bytes tagged, datetimes as plain ISO strings."""

    def default(v: Any) -> Any:
        if isinstance(v, (bytes, bytearray)):
            return {"__type": "Uint8Array", "data": base64.b64encode(bytes(v)).decode("ascii")}
        if isinstance(v, datetime):
            return codec.format_iso(v)
        raise TypeError(type(v).__name__)

    return json.dumps(value, default=default, separators=(",", ":"))
