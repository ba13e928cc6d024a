"""Helpers of the ``test_runs_*`` modules: a run-cell client over the RPC route and a test clock.

``RunClient(rpc, run_id)`` sends ``applyEvent`` and the reads of one run cell
through the real route (codec, router, dispatch), exactly as the JS client
does. ``Clock`` is a settable ``worldcell.clock``. The fixtures ``run``
(``tests/runs/conftest.py``) and ``frozen_clock`` (``tests/conftest.py``) use them.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from worldcell import clock as world_clock

_UNSET = object()


class RunClient:
    """One run cell spoken to over ``/v1/rpc/runs/<run_id>/…``."""

    def __init__(self, rpc, run_id: str):
        self.rpc = rpc
        self.run_id = run_id

    def send(self, event_type: Any = _UNSET, correlation_id: Any = _UNSET, event_data: Any = _UNSET,
             *, token_holder: Any = _UNSET, **data: Any) -> tuple[int, Any]:
        """POST ``applyEvent`` and return ``(status, body)``; unset members are left out."""
        if event_type is not _UNSET:
            data["eventType"] = event_type
        if correlation_id is not _UNSET:
            data["correlationId"] = correlation_id
        if event_data is not _UNSET:
            data["eventData"] = event_data
        request: dict[str, Any] = {"runId": self.run_id, "data": data}
        if token_holder is not _UNSET:
            request["tokenHolder"] = token_holder
        return self.rpc("runs", self.run_id, "applyEvent", request)

    def apply(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """``send`` and assert HTTP 200; returns the outcome (ok or not)."""
        status, body = self.send(*args, **kwargs)
        assert status == 200, (status, body)
        assert isinstance(body, dict) and "ok" in body, body
        return body

    def ok(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """``apply`` and assert ``ok: true``."""
        outcome = self.apply(*args, **kwargs)
        assert outcome["ok"] is True, outcome
        return outcome

    def refused(self, code: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """``apply`` and assert ``ok: false`` with ``code``; returns the outcome."""
        outcome = self.apply(*args, **kwargs)
        assert outcome["ok"] is False and outcome["code"] == code, outcome
        return outcome

    def create(self, input: Any = ("arg",), workflow_name: str = "wf", **event_data: Any) -> dict[str, Any]:
        """``run_created`` with deployment ``dep`` and ``input``."""
        data = {"deploymentId": "dep", "workflowName": workflow_name, "input": list(input), **event_data}
        return self.ok("run_created", event_data=data)

    def step(self, step_id: str, name: str = "test-step", **event_data: Any) -> dict[str, Any]:
        """``step_created``."""
        return self.ok("step_created", step_id, {"stepName": name, **event_data})

    def hook(self, hook_id: str, token: str, **event_data: Any) -> dict[str, Any]:
        """``hook_created`` with a free token."""
        return self.ok("hook_created", hook_id, {"token": token, **event_data})

    def call(self, method: str, *args: Any) -> Any:
        return self.rpc.ok("runs", self.run_id, method, *args)

    def get_run(self) -> Any:
        return self.call("getRun")

    def get_step(self, step_id: str) -> Any:
        return self.call("getStep", step_id)

    def get_event(self, event_id: str) -> Any:
        return self.call("getEvent", event_id)

    def list_events(self, params: Any = None) -> dict[str, Any]:
        return self.call("listEvents", params)

    def list_steps(self, params: Any = None) -> dict[str, Any]:
        return self.call("listSteps", params)

    def list_hooks(self, params: Any = None) -> dict[str, Any]:
        return self.call("listHooks", params)

    def event_types(self) -> list[str]:
        return [e["eventType"] for e in self.list_events({"limit": 10_000})["data"]]

    def event_ids(self) -> list[str]:
        return [e["eventId"] for e in self.list_events({"limit": 10_000})["data"]]


class Clock:
    """A settable clock installed as ``worldcell.clock`` (epoch milliseconds)."""

    def __init__(self, ms: int):
        self.ms = ms

    def __call__(self) -> int:
        return self.ms

    def advance(self, ms: int) -> None:
        self.ms += ms

    @property
    def now(self) -> datetime:
        return world_clock.from_epoch_ms(self.ms)


def at(iso: str) -> datetime:
    """An aware UTC datetime from ``YYYY-MM-DDTHH:MM:SS[.mmm]``."""
    return datetime.fromisoformat(iso).replace(tzinfo=timezone.utc)


def page_through(fetch, limit: int, sort_order: str = "asc") -> list[Any]:
    """Follow ``cursor`` until ``hasMore`` is false; returns every item seen (in order)."""
    items: list[Any] = []
    cursor = None
    for _ in range(10_000):
        page = fetch({"limit": limit, "cursor": cursor, "sortOrder": sort_order})
        assert len(page["data"]) <= limit
        items += page["data"]
        if not page["hasMore"]:
            assert page["cursor"] is None
            return items
        assert page["cursor"] is not None
        cursor = page["cursor"]
    raise AssertionError("pagination does not end")
