"""Bearer-token authentication of the RPC route (docs/protocol.md §2.4)."""
from __future__ import annotations

import hashlib
import hmac

_PREFIX = "Bearer "


def bearer_token_is_valid(header: str | None, secret: str) -> bool:
    """True when ``header`` is ``Bearer <secret>`` exactly.

    Args:
        header: the raw ``Authorization`` header value, or None when absent.
        secret: the configured ``WORLD_SECRET`` (non-empty).

    The scheme is case-sensitive with exactly one space; the token is not
    trimmed further. The comparison hashes both sides with SHA-256 and compares
    the digests with ``hmac.compare_digest``, so it takes the same time
    whatever the token's length or content.
    """
    if header is None:
        return False
    header = header.strip(" \t")
    if not header.startswith(_PREFIX):
        return False
    token = header[len(_PREFIX):]
    if not token:
        return False
    given = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
    expected = hashlib.sha256(secret.encode("utf-8", "surrogatepass")).digest()
    return hmac.compare_digest(given, expected)
