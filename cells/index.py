"""The index cell service: ordered key/value storage plus hook-token ownership (docs/protocol.md §4.3, §6).

``IndexCell(name)`` serves the ``index`` binding. The reference client only
ever uses the cell name ``index``; any other name is a separate, empty cell.

Concurrency (docs/architecture.md rule 1, adapted to a cell that every run shares):

* ``get``/``list`` read without locks.
* ``put``/``delete`` are one SQL statement each; unrelated keys never wait
  for each other (only writers of the *same* key meet on its row lock).
* The four hook-token methods are one transaction each, serialized **per
  token** by ``lock_hook_token`` (a PostgreSQL transaction-level advisory
  lock on a hash of (cell, token); SQLite's IMMEDIATE transactions are already
  exclusive). Every write of a ``hook:<t>`` or ``hookclaim:<t>`` key — hook
  methods and plain ``put``/``delete`` alike — holds that lock, so the
  check-and-set of §6.3 sees a stable view of its token. ``hookid:<id>`` rows
  are read ``FOR UPDATE`` where a removal depends on their content.
"""
from __future__ import annotations

import json
from typing import Any

from django.db import transaction

from worldcell import clock, codec
from worldcell.errors import CellError, ValidationError
from worldcell.keys import require_storable
from worldcell.tenancy import DEFAULT_TENANT

from . import fence
from .javascript import js_string
from .models import IndexEntry, lock_hook_token

__all__ = ["IndexCell", "prefix_upper_bound"]

#: Default page size of ``list`` (§4.0 P3).
DEFAULT_LIST_LIMIT = 1000
#: Largest stored key, in UTF-8 bytes: (cell, key) must fit one PostgreSQL btree entry.
KEY_MAX_BYTES = 2048
#: Largest index cell name, in UTF-8 bytes.
CELL_NAME_MAX_BYTES = 512
#: Page sizes above this are clamped (§12 A10); nobody can hold more rows in one answer.
_FETCH_CAP = 2**31 - 2

_ABSENT: Any = object()
#: Key families whose writes are serialized per token (§6.1).
_TOKEN_FAMILIES = ("hook:", "hookclaim:")


def prefix_upper_bound(prefix: str) -> str | None:
    """The smallest string above every string that starts with ``prefix`` (code-point order).

    ``"run:"`` -> ``"run;"``; a trailing U+10FFFF is dropped and the character
    before it incremented; returns None when no bound exists (empty prefix,
    or only U+10FFFF). Together with ``key >= prefix`` this selects exactly
    the keys with that prefix, for any characters (no LIKE wildcards).
    """
    chars = list(prefix)
    while chars:
        code = ord(chars[-1])
        if code < 0x10FFFF:
            code += 1
            if 0xD800 <= code <= 0xDFFF:  # surrogates cannot occur in stored keys
                code = 0xE000
            chars[-1] = chr(code)
            return "".join(chars)
        chars.pop()
    return None


def _owner_arg(value: Any, field: str = "owner") -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValidationError(f"{field}: expected an object {{runId, hookId}}")
    for member in ("runId", "hookId"):
        if not isinstance(value.get(member), str):
            raise ValidationError(f"{field}.{member}: expected a string")
    return value


def _same_owner(left: dict[str, Any], right: dict[str, Any]) -> bool:
    """Owners are equal iff both runId and hookId are equal strings (§6.3)."""
    return all(
        isinstance(left.get(m), str) and isinstance(right.get(m), str) and left[m] == right[m]
        for m in ("runId", "hookId")
    )


def _reject_constant(name: str) -> Any:
    raise ValueError(f"Unexpected token {name[0]!r}")


_STRICT_JSON = json.JSONDecoder(parse_constant=_reject_constant)


def _published_owner(key: str, text: str) -> dict[str, Any]:
    """The owner ``{runId, hookId}`` of the hook JSON stored at ``key`` (§6.3).

    Upstream reads it with ``JSON.parse(value)``, which first makes a value that
    is not a string into one with ``String(value)``: a number, a boolean or
    ``[5]`` parse (to a hook with no owner), ``{}`` ("[object Object]") does not
    (docs/protocol.md §6.3 "Values the client did not write").

    Raises CellError named ``SyntaxError`` (500) when that text is not JSON,
    and ``TypeError`` when it is JSON ``null``.
    """
    raw = js_string(codec.decode(text))
    try:
        hook = _STRICT_JSON.decode(raw)
    except ValueError as exc:
        raise CellError(f"{exc} in the JSON at {key}", name="SyntaxError") from None
    if hook is None:
        raise CellError("Cannot read properties of null (reading 'runId')", name="TypeError")
    if not isinstance(hook, dict):
        return {}
    return {m: hook[m] for m in ("runId", "hookId") if m in hook}


def _claim_owner(key: str, text: str) -> dict[str, Any]:
    """The ``owner`` object of the claim stored at ``key`` (``{owner, reservedAt}``, §6.1).

    Raises CellError named ``TypeError`` (500) when the value is not a claim.
    """
    claim = codec.decode(text)
    owner = claim.get("owner") if isinstance(claim, dict) else None
    if not isinstance(owner, dict):
        raise CellError(f"Cannot read properties of undefined (reading 'runId') at {key}", name="TypeError")
    return owner


class IndexCell:
    """One index cell: the global secondary indexes of the world (docs/protocol.md §6).

    Args:
        name: the cell name (decoded URL segment); the client uses ``index``.

    Raises ValidationError when the name cannot be stored (U+0000, unpaired
    surrogate, longer than ``CELL_NAME_MAX_BYTES``).
    """

    def __init__(self, name: str, tenant: str = DEFAULT_TENANT):
        self.name = require_storable(name, "cell name", max_bytes=CELL_NAME_MAX_BYTES)
        self.tenant = tenant

    # ------------------------------------------------------------ plain KV (§6.2)

    def _key(self, key: Any, field: str = "key") -> str:
        return require_storable(key, field, max_bytes=KEY_MAX_BYTES)

    def get(self, key: Any = _ABSENT) -> Any:
        """``get(key)`` -> the stored value (any JSON value, bytes, dates) or None when absent.

        Raises ValidationError (400) for a non-string key.
        """
        text = IndexEntry.objects.value_of(self.name, self._key(key), tenant=self.tenant)
        return None if text is None else codec.decode(text)

    def put(self, key: Any = _ABSENT, value: Any = _ABSENT) -> None:
        """``put(key, value)`` -> None. Stores (overwrites) ``value`` under ``key``.

        Any JSON value is accepted and stored codec-encoded; JSON null is
        stored as null. Raises ValidationError (400) for a non-string key or a
        missing value.
        """
        key = self._key(key)
        if value is _ABSENT:
            raise ValidationError("value: required")
        items = [(key, codec.encode(value))]
        token = _token_of(key)
        if token is None:
            run_id = fence.run_of_index_key(key)
            if run_id is not None:  # never list an expired run again (docs/lifecycle.md)
                fence.put_index_unless_expired(self.name, key, items[0][1], run_id, tenant=self.tenant)
                return
            IndexEntry.objects.put_values(self.name, items, tenant=self.tenant)
            return
        with transaction.atomic():
            lock_hook_token(self.name, token, tenant=self.tenant)
            IndexEntry.objects.put_values(self.name, items, tenant=self.tenant)

    def delete(self, key: Any = _ABSENT) -> None:
        """``delete(key)`` -> None. Removes ``key`` if present (no error when missing).

        Raises ValidationError (400) for a non-string key.
        """
        key = self._key(key)
        token = _token_of(key)
        if token is None:
            IndexEntry.objects.delete_keys(self.name, [key], tenant=self.tenant)
            return
        with transaction.atomic():
            lock_hook_token(self.name, token, tenant=self.tenant)
            IndexEntry.objects.delete_keys(self.name, [key], tenant=self.tenant)

    def list_keys(self, options: Any = None) -> dict[str, Any]:
        """``list(options?)`` -> a P3 page (docs/protocol.md §4.0).

        ``options`` (object or null): ``prefix`` (default ``""``), ``cursor``
        (a full key; null = absent, §12 A6), ``limit`` (non-negative integer,
        default 1000), ``reverse`` (boolean). Ascending keys with the prefix
        are strictly greater than the cursor; reverse ones strictly less, in
        descending order. Returns ``{"keys":[{"name":k}…], "list_complete":
        bool}`` plus ``"cursor"`` (the last returned key) only when the list
        is not complete and the page is not empty.

        Raises ValidationError (400) for a mis-typed option.
        """
        if options is None:
            options = {}
        if not isinstance(options, dict):
            raise ValidationError("options: expected an object or null")
        prefix = options.get("prefix")
        prefix = "" if prefix is None else require_storable(prefix, "options.prefix")
        cursor = options.get("cursor")
        if cursor is not None:
            cursor = require_storable(cursor, "options.cursor")
        limit = options.get("limit")
        if limit is None:
            limit = DEFAULT_LIST_LIMIT
        elif not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise ValidationError("options.limit: expected a non-negative integer")
        reverse = options.get("reverse")
        if reverse is None:
            reverse = False
        elif not isinstance(reverse, bool):
            raise ValidationError("options.reverse: expected a boolean")

        limit = min(limit, _FETCH_CAP)
        names = IndexEntry.objects.page_of_keys(
            self.name,
            tenant=self.tenant,
            lower=prefix,
            upper=prefix_upper_bound(prefix),
            cursor=cursor,
            reverse=reverse,
            fetch=limit + 1,
        )
        page = names[:limit]
        result: dict[str, Any] = {
            "keys": [{"name": name} for name in page],
            "list_complete": len(names) <= limit,
        }
        if not result["list_complete"] and page:
            result["cursor"] = page[-1]
        return result

    # ------------------------------------------------------------ hook tokens (§6.3)

    def _token(self, token: Any) -> str:
        # The longest family prefix ("hookclaim:") must still fit KEY_MAX_BYTES.
        return require_storable(token, "token", max_bytes=KEY_MAX_BYTES - len("hookclaim:"))

    def reserve_hook_token(self, token: Any = _ABSENT, owner: Any = _ABSENT) -> dict[str, Any]:
        """``reserveHookToken(token, owner)`` -> ``{"claimed":true}`` or ``{"claimed":false,"holder":…}``.

        One transaction under the token's lock (§6.3): a published token
        (``hook:<token>``) is never reserved again, even by its own holder;
        a claim by another owner wins; otherwise ``hookclaim:<token>`` =
        ``{owner, reservedAt: now ms}`` is (re)written. Claims never expire
        (§12 A13).

        Raises ValidationError (400) for a non-string token or a malformed
        owner; CellError ``SyntaxError`` (500) when ``hook:<token>`` is not JSON.
        """
        token = self._token(token)
        owner = _owner_arg(owner)
        hook_key, claim_key = f"hook:{token}", f"hookclaim:{token}"
        now = clock.now_ms()
        with transaction.atomic():
            lock_hook_token(self.name, token, tenant=self.tenant)
            found = IndexEntry.objects.values_of(self.name, [hook_key, claim_key], tenant=self.tenant)
            if hook_key in found:
                return {"claimed": False, "holder": _published_owner(hook_key, found[hook_key])}
            if claim_key in found:
                holder = _claim_owner(claim_key, found[claim_key])
                if not _same_owner(holder, owner):
                    return {"claimed": False, "holder": holder}
            claim = codec.encode({"owner": owner, "reservedAt": now})
            IndexEntry.objects.put_values(self.name, [(claim_key, claim)], tenant=self.tenant)
        return {"claimed": True}

    def finalize_hook_indexes(
        self, token: Any = _ABSENT, hook_id: Any = _ABSENT, serialized_hook: Any = _ABSENT, owner: Any = _ABSENT
    ) -> None:
        """``finalizeHookIndexes(token, hookId, serializedHook, owner)`` -> None.

        One transaction under the token's lock (§6.3): refuses with CellError
        (500) ``Hook token <token> is owned by another hook`` when
        ``hook:<token>`` holds another owner's hook, and ``… is reserved by
        another hook`` when ``hookclaim:<token>`` is another owner's; else
        writes ``serializedHook`` to ``hook:<token>`` and ``hookid:<hookId>``
        and drops the claim. Idempotent for the same owner.

        Raises ValidationError (400) for mis-typed arguments.
        """
        token = self._token(token)
        hook_id = require_storable(hook_id, "hookId", max_bytes=KEY_MAX_BYTES - len("hookid:"))
        if not isinstance(serialized_hook, str):
            raise ValidationError("serializedHook: expected a string")
        owner = _owner_arg(owner)
        hook_key, claim_key = f"hook:{token}", f"hookclaim:{token}"
        text = codec.encode(serialized_hook)
        fence.raise_if_expired(owner["runId"])  # no hook index for an expired run (docs/lifecycle.md)
        with transaction.atomic():
            lock_hook_token(self.name, token, tenant=self.tenant)
            found = IndexEntry.objects.values_of(self.name, [hook_key, claim_key], tenant=self.tenant)
            if hook_key in found and not _same_owner(_published_owner(hook_key, found[hook_key]), owner):
                raise CellError(f"Hook token {token} is owned by another hook")
            if claim_key in found and not _same_owner(_claim_owner(claim_key, found[claim_key]), owner):
                raise CellError(f"Hook token {token} is reserved by another hook")
            IndexEntry.objects.put_values(self.name, [(hook_key, text), (f"hookid:{hook_id}", text)], tenant=self.tenant)
            if claim_key in found:
                IndexEntry.objects.delete_keys(self.name, [claim_key], tenant=self.tenant)

    def release_hook_token(self, token: Any = _ABSENT, owner: Any = _ABSENT) -> None:
        """``releaseHookToken(token, owner)`` -> None.

        Deletes ``hookclaim:<token>`` only when it is ``owner``'s claim; never
        touches ``hook:``/``hookid:`` keys (§6.3). Raises ValidationError (400)
        for mis-typed arguments.
        """
        token = self._token(token)
        owner = _owner_arg(owner)
        claim_key = f"hookclaim:{token}"
        with transaction.atomic():
            lock_hook_token(self.name, token, tenant=self.tenant)
            found = IndexEntry.objects.values_of(self.name, [claim_key], tenant=self.tenant)
            if claim_key in found and _same_owner(_claim_owner(claim_key, found[claim_key]), owner):
                IndexEntry.objects.delete_keys(self.name, [claim_key], tenant=self.tenant)

    def delete_hook_indexes(self, token: Any = _ABSENT, hook_id: Any = _ABSENT, owner: Any = _ABSENT) -> None:
        """``deleteHookIndexes(token, hookId, owner)`` -> None.

        One transaction (§6.3): deletes ``hook:<token>``, ``hookid:<hookId>``
        and ``hookclaim:<token>``, each only if it belongs to ``owner``.
        Raises ValidationError (400) for mis-typed arguments; CellError
        ``SyntaxError`` (500) when a stored hook value is not JSON.
        """
        token = self._token(token)
        hook_id = require_storable(hook_id, "hookId", max_bytes=KEY_MAX_BYTES - len("hookid:"))
        owner = _owner_arg(owner)
        hook_key, id_key, claim_key = f"hook:{token}", f"hookid:{hook_id}", f"hookclaim:{token}"
        with transaction.atomic():
            lock_hook_token(self.name, token, tenant=self.tenant)
            # FOR UPDATE: hookid:<id> is not covered by the token lock.
            found = IndexEntry.objects.values_of(self.name, [hook_key, id_key, claim_key], tenant=self.tenant, for_update=True)
            doomed = []
            if hook_key in found and _same_owner(_published_owner(hook_key, found[hook_key]), owner):
                doomed.append(hook_key)
            if id_key in found and _same_owner(_published_owner(id_key, found[id_key]), owner):
                doomed.append(id_key)
            if claim_key in found and _same_owner(_claim_owner(claim_key, found[claim_key]), owner):
                doomed.append(claim_key)
            IndexEntry.objects.delete_keys(self.name, doomed, tenant=self.tenant)


def _token_of(key: str) -> str | None:
    """The token of a ``hook:<t>``/``hookclaim:<t>`` key, else None."""
    for family in _TOKEN_FAMILIES:
        if key.startswith(family):
            return key[len(family):]
    return None
