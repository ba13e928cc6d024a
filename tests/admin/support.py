"""Helpers of the console tests (``tests/admin/``): operators, a world-client sequence in-process, seeding.

* ``make_operator(*perms)`` (fixture, ``tests/admin/conftest.py``) — an
  active staff user with the given ``app.codename`` permissions, logged in
  on a fresh test client.
* ``ClientSequence(rpc)`` — applies events the way the world-celld client
  does (hook-token reservation, run index keys, hook indexes, released-hook
  cleanup; docs/protocol.md §6.3), over the real RPC route.
* ``seed_runs(n_runs, n_steps)`` — bulk-inserts runs with steps, events and
  hooks straight into the tables (for query-count tests on big pages).
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any


from cells.event_machine import format_event_id
from cells.models import Event, Hook, HookMarker, Run, RunCellState, Step
from cells.models.runs import creation_sort_key
from worldcell import codec
from worldcell_client import index_calls_after_apply_event

ADMIN = "/admin/"
RUNS = "/admin/cells/run/"


class ClientSequence:
    """Apply events as the JS client does, in-process over the RPC route (docs/protocol.md §6.3)."""

    def __init__(self, rpc):
        self.rpc = rpc

    def index(self, method: str, *args: Any) -> Any:
        return self.rpc.ok("index", "index", method, *args)

    def apply(self, run_id: str, event_type: str, correlation_id: str | None = None, **event_data: Any) -> dict:
        data: dict[str, Any] = {"eventType": event_type}
        if correlation_id is not None:
            data["correlationId"] = correlation_id
        if event_data or event_type not in ("run_started", "run_cancelled", "hook_disposed", "step_started"):
            data["eventData"] = event_data
        owner = holder = None
        if event_type == "hook_created":
            owner = {"runId": run_id, "hookId": correlation_id}
            claim = self.index("reserveHookToken", event_data["token"], owner)
            holder = None if claim["claimed"] else claim["holder"]
        outcome = self.rpc.ok("runs", run_id, "applyEvent", {"runId": run_id, "data": data, "tokenHolder": holder})
        assert outcome["ok"], outcome
        reserved = None if owner is None else (event_data["token"], owner)
        for method, args in index_calls_after_apply_event(run_id, outcome, reserved):
            self.index(method, *args)
        return outcome

    def create_run(self, run_id: str, workflow: str = "wf-order", deployment: str = "dpl_1",
                   input: Any = ("arg",)) -> dict:
        return self.apply(run_id, "run_created", deploymentId=deployment, workflowName=workflow,
                          input=list(input) if isinstance(input, tuple) else input)

    def start_run(self, run_id: str) -> dict:
        return self.apply(run_id, "run_started")


def seed_runs(n_runs: int, n_steps: int, *, start=None, workflows=("wf-a", "wf-b"), hooks: int = 2,
              first: int = 0) -> list[Run]:
    """Bulk-insert ``n_runs`` running runs of ``n_steps`` completed steps each (+ their events, ``hooks`` hooks).

    Rows look like what ``applyEvent`` writes (same columns, sort keys,
    event ids and encoded bodies), without going through it: this is for
    pages with many rows, not for behaviour.
    """
    from datetime import datetime, timezone

    start = start or datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=timezone.utc)
    cells = RunCellState.objects.bulk_create(
        [RunCellState(name=f"wrun_seed{i:06d}", event_sequence=2 + 2 * n_steps + hooks)
         for i in range(first, first + n_runs)]
    )
    runs, steps, events, hook_rows, markers = [], [], [], [], []
    for i, cell in enumerate(cells, start=first):
        created = start + timedelta(seconds=i)
        run = Run(
            cell=cell, status="running", deployment_id=f"dpl_{i % 3}", workflow_name=workflows[i % len(workflows)],
            spec_version=3, input=codec.encode([f"input {i}", b"\x00\x01"]), started_at=created,
            created_at=created, updated_at=created,
        )
        runs.append(run)
        seq = 0

        def event(event_type: str, correlation: str | None, data: Any = None, at=created) -> None:
            nonlocal seq
            seq += 1
            body: dict[str, Any] = {"eventType": event_type}
            if correlation:
                body["correlationId"] = correlation
            if data is not None:
                body["eventData"] = data
            body.update(runId=cell.name, eventId=format_event_id(seq), createdAt=at, specVersion=3)
            events.append(Event(run_id=cell.pk, event_id=format_event_id(seq), sequence=seq, event_type=event_type,
                                correlation_id=correlation, created_at=at, body=codec.encode(body)))

        event("run_created", None, {"deploymentId": run.deployment_id, "workflowName": run.workflow_name})
        event("run_started", None)
        for s in range(n_steps):
            sid = f"step_{s:04d}"
            at = created + timedelta(milliseconds=s)
            steps.append(Step(
                run_id=cell.pk, step_id=sid, step_name=f"do-{s}", status="completed", attempt=1,
                input=codec.encode([s]), output=codec.encode({"ok": s}), started_at=at, completed_at=at,
                created_at=at, updated_at=at, spec_version=3, sort_key=creation_sort_key(at, sid),
            ))
            event("step_created", sid, {"stepName": f"do-{s}", "input": [s]}, at)
            event("step_completed", sid, {"result": {"ok": s}}, at)
        for h in range(hooks):
            hid = f"hook_{h}"
            hook_rows.append(Hook(run_id=cell.pk, hook_id=hid, token=f"tok-{i}-{h}", metadata=codec.encode({"h": h}),
                                  created_at=created, spec_version=3, sort_key=creation_sort_key(created, hid)))
            markers.append(HookMarker(run_id=cell.pk, hook_id=hid, event_id=format_event_id(seq + 1)))
            event("hook_created", hid, {"token": f"tok-{i}-{h}"})
    Run.objects.bulk_create(runs)
    Step.objects.bulk_create(steps, batch_size=2000)
    Event.objects.bulk_create(events, batch_size=2000)
    Hook.objects.bulk_create(hook_rows, batch_size=2000)
    HookMarker.objects.bulk_create(markers, batch_size=2000)
    return runs
