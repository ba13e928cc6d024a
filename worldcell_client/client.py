"""``WorldClient``: calls a fleet's RPC route the way the world-celld JS client does.

Same URLs, headers and argument arrays, and the same call sequences around
``applyEvent`` (hook-token reservation, the index writes of
``index_writes``), queue shard selection and stream registration
(docs/protocol.md §2, §6.3, §7.11, §8.3).
"""
from __future__ import annotations

import json
from typing import Any

import httpx

from worldcell import codec

from .index_writes import INDEX_CELL, index_calls_after_apply_event
from .wire import encode_uri_component, shard_for, shared_codec_dumps, ulid

__all__ = ["RpcCallError", "WorldClient"]


class RpcCallError(Exception):
    """A non-2xx answer: ``status`` (HTTP), ``name`` and ``message`` from the error body (docs/protocol.md §2.9)."""

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

    # -- runs + index, as the client sequences them (docs/protocol.md §6.3) -------

    def apply_event(self, run_id: str, data: dict[str, Any]) -> dict[str, Any]:
        """Apply one event the way the JS client does and return the outcome.

        For ``hook_created`` the token is reserved first; after an ``ok: true``
        outcome the calls of ``index_calls_after_apply_event`` follow (run
        keys, hook indexes or token release, released hooks, correlation key).
        ``ok: false`` outcomes are returned as they are, after releasing a
        reserved token; an RpcCallError is re-raised after the same release.
        """
        reserved = None
        if data.get("eventType") == "hook_created":
            reserved = (data["eventData"]["token"], {"runId": run_id, "hookId": data["correlationId"]})
            claim = self.call("index", INDEX_CELL, "reserveHookToken", *reserved)
            token_holder = None if claim.get("claimed") else claim.get("holder")
        else:
            token_holder = None
        try:
            outcome = self.call("runs", run_id, "applyEvent", {"runId": run_id, "data": data, "tokenHolder": token_holder})
        except RpcCallError:
            if reserved is not None:
                self.call("index", INDEX_CELL, "releaseHookToken", *reserved)
            raise
        if not outcome.get("ok"):
            if reserved is not None:
                self.call("index", INDEX_CELL, "releaseHookToken", *reserved)
            return outcome
        for method, args in index_calls_after_apply_event(run_id, outcome, reserved):
            self.call("index", INDEX_CELL, method, *args)
        return outcome

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        """``runs.getRun``: the run entity (dates as datetimes) or None."""
        return self.call("runs", run_id, "getRun")

    def list_events(self, run_id: str, **params: Any) -> dict[str, Any]:
        """``runs.listEvents`` with P1 params (``limit``, ``cursor``, ``sortOrder``…): ``{data, cursor, hasMore}``."""
        return self.call("runs", run_id, "listEvents", params)

    def list_runs(self, workflow_name: str | None = None, *, limit: int = 20, cursor: str | None = None) -> dict[str, Any]:
        """One page of the run index (``index.list`` over ``run:`` / ``runall:`` keys, newest first).

        Returns the P3 page ``{"keys": [{"name": key}], "list_complete": bool,
        "cursor"?: key}`` (docs/protocol.md §4.0); a key ends with the run id
        (``run:<workflow>:<ms13>:<runId>``), pass ``cursor`` back for the next page.
        """
        prefix = f"run:{workflow_name}:" if workflow_name is not None else "runall:"
        options: dict[str, Any] = {"prefix": prefix, "limit": limit, "reverse": True}
        if cursor is not None:
            options["cursor"] = cursor
        return self.call("index", INDEX_CELL, "list", options)

    def hook_by_token(self, token: str) -> dict | None:
        """The published hook of ``token`` (parsed shared-codec JSON), or None."""
        text = self.call("index", INDEX_CELL, "get", f"hook:{token}")
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

    def list_dead_letters(self, shard: int = 0, **params: Any) -> dict[str, Any]:
        """``queue.listDeadLetters`` on ``q:<shard>`` (P4 params ``limit``, ``cursor``)."""
        return self.call("queue", f"q:{shard}", "listDeadLetters", params)

    def redrive_dead_letter(self, message_id: str, shard: int = 0) -> bool:
        """``queue.redriveDeadLetter`` on ``q:<shard>``: True when the message is pending again."""
        return bool(self.call("queue", f"q:{shard}", "redriveDeadLetter", message_id).get("ok"))

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
