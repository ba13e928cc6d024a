"""A Python RPC client that talks to a fleet the way the world-celld JS client does.

It is what the benchmark command and the end-to-end tests use to drive a
running fleet from outside, over HTTP: the same URLs, headers and argument
arrays, and the same call sequences around ``applyEvent`` (index puts, the
hook-token protocol, released-hook cleanup, correlation keys — PROTOCOL.md
§6.3), queue shard selection (FNV-1a, §7.11) and stream registration (§8.3).
"""
from __future__ import annotations

import base64
import json
import os
import time
from datetime import datetime
from typing import Any
from urllib.parse import quote

import httpx

from . import codec

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
    """JavaScript ``encodeURIComponent`` (PROTOCOL.md §6.1 note)."""
    return quote(text, safe="-_.!~*'()")


def shard_for(key: str, shards: int) -> int:
    """The queue shard of ``key``: FNV-1a over UTF-16 code units mod ``shards`` (§7.11)."""
    if shards <= 1:
        return 0
    h = 0x811C9DC5
    data = key.encode("utf-16-le", "surrogatepass")
    for i in range(0, len(data), 2):
        h ^= data[i] | (data[i + 1] << 8)
        h = (h * 0x01000193) & 0xFFFFFFFF
    return h % shards


def ms13(ms: int) -> str:
    """Epoch milliseconds left-padded to 13 digits (§0)."""
    return str(max(0, int(ms))).zfill(13)


def shared_codec_dumps(value: Any) -> str:
    """The client's *shared* codec (§3.3): bytes tagged, datetimes as plain ISO strings."""

    def default(v: Any) -> Any:
        if isinstance(v, (bytes, bytearray)):
            return {"__type": "Uint8Array", "data": base64.b64encode(bytes(v)).decode("ascii")}
        if isinstance(v, datetime):
            return codec.format_iso(v)
        raise TypeError(type(v).__name__)

    return json.dumps(value, default=default, separators=(",", ":"))


class RpcCallError(Exception):
    """A non-2xx answer: ``status`` (HTTP), ``name`` and ``message`` from the error body."""

    def __init__(self, status: int, name: str, message: str):
        super().__init__(f"{status} {name}: {message}")
        self.status, self.name, self.message = status, name, message


class WorldClient:
    """Calls ``POST /v1/rpc/{binding}/{name}/{method}`` on a fleet.

    Args:
        base_url: the fleet URL, e.g. ``http://127.0.0.1:8787``.
        secret: the ``WORLD_SECRET`` sent as a bearer token.
        http: an optional shared ``httpx.Client`` (connection pooling).
        timeout_s: per-request timeout in seconds (the JS client uses 30).
    """

    def __init__(self, base_url: str, secret: str, http: httpx.Client | None = None, timeout_s: float = 30.0):
        self.base_url = base_url.rstrip("/")
        self.http = http or httpx.Client(timeout=timeout_s)
        self.headers = {"content-type": "application/json", "authorization": f"Bearer {secret}"}

    # -- transport ---------------------------------------------------------------

    def call(self, binding: str, name: str, method: str, *args: Any) -> Any:
        """Invoke one RPC method; returns the decoded result or raises RpcCallError."""
        url = f"{self.base_url}/v1/rpc/{binding}/{encode_uri_component(name)}/{method}"
        resp = self.http.post(url, content=codec.encode(list(args)), headers=self.headers)
        if resp.status_code // 100 != 2:
            try:
                err = json.loads(resp.content)["error"]
                raise RpcCallError(resp.status_code, err.get("name", "Error"), err.get("message", ""))
            except (ValueError, KeyError, TypeError):
                raise RpcCallError(resp.status_code, "Error", resp.text[:200]) from None
        return codec.decode(resp.content)

    def health(self) -> dict:
        """``GET /v1/health`` as a dict."""
        return self.http.get(f"{self.base_url}/v1/health").json()

    # -- runs + index, as the client sequences them (§6.3) ------------------------

    def apply_event(self, run_id: str, data: dict[str, Any]) -> dict[str, Any]:
        """Apply one event the way the JS client does and return the outcome.

        For ``hook_created`` the token is reserved first and finalized or
        released afterwards; a returned ``run`` is written to the ``run:`` and
        ``runall:`` index keys; released hooks are un-indexed; an event with a
        ``correlationId`` gets its ``correlation:`` key. ``ok:false`` outcomes
        are returned as they are (after releasing a reserved token).
        """
        event_type = data.get("eventType")
        token_holder = None
        owner = None
        if event_type == "hook_created":
            owner = {"runId": run_id, "hookId": data["correlationId"]}
            token = data["eventData"]["token"]
            claim = self.call("index", "index", "reserveHookToken", token, owner)
            token_holder = None if claim.get("claimed") else claim.get("holder")
        try:
            outcome = self.call("runs", run_id, "applyEvent", {"runId": run_id, "data": data, "tokenHolder": token_holder})
        except RpcCallError:
            if owner is not None:
                self.call("index", "index", "releaseHookToken", data["eventData"]["token"], owner)
            raise
        if not outcome.get("ok"):
            if owner is not None:
                self.call("index", "index", "releaseHookToken", data["eventData"]["token"], owner)
            return outcome
        run = outcome.get("run")
        if run is not None:
            meta = json.dumps(
                {"runId": run["runId"], "createdAt": codec.format_iso(run["createdAt"]), "status": run["status"]},
                separators=(",", ":"),
            )
            created = ms13(codec.epoch_ms(run["createdAt"]))
            self.call("index", "index", "put", f"run:{run['workflowName']}:{created}:{run['runId']}", meta)
            self.call("index", "index", "put", f"runall:{created}:{run['runId']}", meta)
        hook = outcome.get("hookToIndex")
        if hook is not None:
            self.call(
                "index", "index", "finalizeHookIndexes", hook["token"], hook["hookId"],
                shared_codec_dumps(hook), {"runId": hook["runId"], "hookId": hook["hookId"]},
            )
        elif owner is not None:
            self.call("index", "index", "releaseHookToken", data["eventData"]["token"], owner)
        for released in outcome.get("releasedHooks", []):
            self.call(
                "index", "index", "deleteHookIndexes", released["token"], released["hookId"],
                {"runId": run_id, "hookId": released["hookId"]},
            )
        event = outcome.get("event")
        if event is not None and event.get("correlationId"):
            key = (
                f"correlation:{encode_uri_component(event['correlationId'])}:"
                f"{ms13(codec.epoch_ms(event['createdAt']))}:{event['eventId']}:{run_id}"
            )
            self.call("index", "index", "put", key, json.dumps({"runId": run_id, "eventId": event["eventId"]}))
        return outcome

    def hook_by_token(self, token: str) -> dict | None:
        """The published hook of ``token`` (parsed shared-codec JSON), or None."""
        text = self.call("index", "index", "get", f"hook:{token}")
        return json.loads(text) if isinstance(text, str) else None

    # -- queue --------------------------------------------------------------------

    def enqueue(
        self,
        queue_name: str,
        payload: Any,
        *,
        target_base_url: str,
        shards: int = 1,
        idempotency_key: str | None = None,
        delay_seconds: float | None = None,
        message_id: str | None = None,
    ) -> dict[str, Any]:
        """Enqueue ``payload`` (shared-codec encoded) on the shard the JS client would pick.

        ``pathname`` is ``flow`` for ``__wkf_workflow_*`` queues and ``step``
        otherwise. Returns the enqueue outcome (``messageId``, ``deduped``).
        """
        message_id = message_id or f"msg_{ulid()}"
        request: dict[str, Any] = {
            "messageId": message_id,
            "queueName": queue_name,
            "pathname": "flow" if "_workflow_" in queue_name else "step",
            "body": payload if isinstance(payload, str) else shared_codec_dumps(payload),
            "config": {"targetBaseUrl": target_base_url, "queueShards": shards},
        }
        if idempotency_key is not None:
            request["idempotencyKey"] = idempotency_key
        if delay_seconds is not None:
            request["delaySeconds"] = delay_seconds
        cell = f"q:{shard_for(idempotency_key or message_id, shards)}"
        return self.call("queue", cell, "enqueue", request)

    # -- streams ------------------------------------------------------------------

    def write_stream(self, run_id: str, name: str, chunk: bytes | str, *, register: bool = True) -> int:
        """Register ``name`` for ``run_id`` (unless told not to) and append one chunk; returns its index."""
        if register:
            self.call("streams", f"run-streams:{run_id}", "registerStream", name)
        data = chunk.encode("utf-8") if isinstance(chunk, str) else chunk
        return self.call("streams", f"stream:{name}", "writeChunk", data)

    def close_stream(self, run_id: str, name: str) -> None:
        """Register and close stream ``name``."""
        self.call("streams", f"run-streams:{run_id}", "registerStream", name)
        self.call("streams", f"stream:{name}", "closeStream")

    def read_stream(self, name: str, page: int = 32) -> tuple[list[bytes], bool]:
        """All chunks of stream ``name`` read page by page, and whether it is closed."""
        chunks: list[bytes] = []
        while True:
            res = self.call("streams", f"stream:{name}", "getChunks", {"startIndex": len(chunks), "limit": page})
            chunks.extend(res["chunks"])
            if not res["chunks"]:
                return chunks, res["done"]
