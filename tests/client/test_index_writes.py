"""The index writes after applyEvent (``worldcell_client.index_writes``), and the client package's import cost."""
from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timezone

import pytest

from worldcell_client import index_calls_after_apply_event, run_index_entries

pytestmark = pytest.mark.any_database  # runs in the PostgreSQL pass only

CREATED = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=timezone.utc)
RUN = {"runId": "wrun_1", "workflowName": "wf-é", "status": "cancelled", "createdAt": CREATED}


def test_it_imports_without_django_or_celery():
    code = "import sys, worldcell_client; print(sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'celery', 'kombu')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_it_writes_both_run_keys_with_the_js_meta_string():
    meta = '{"runId":"wrun_1","createdAt":"2026-01-02T03:04:05.678Z","status":"cancelled"}'
    assert run_index_entries(RUN) == [
        ("run:wf-é:1767323045678:wrun_1", meta),
        ("runall:1767323045678:wrun_1", meta),
    ]


def test_it_orders_run_keys_hook_release_and_correlation_like_the_js_client():
    outcome = {
        "ok": True,
        "run": RUN,
        "releasedHooks": [{"hookId": "h1", "token": "t1"}],
        "event": {"eventId": "evnt_1", "correlationId": "a/b c", "createdAt": CREATED},
    }
    owner = {"runId": "wrun_1", "hookId": "h9"}
    calls = index_calls_after_apply_event("wrun_1", outcome, ("t9", owner))
    assert [m for m, _ in calls] == ["put", "put", "releaseHookToken", "deleteHookIndexes", "put"]
    assert calls[2] == ("releaseHookToken", ("t9", owner))
    assert calls[3] == ("deleteHookIndexes", ("t1", "h1", {"runId": "wrun_1", "hookId": "h1"}))
    key, value = calls[4][1]
    assert key == "correlation:a%2Fb%20c:1767323045678:evnt_1:wrun_1"
    assert json.loads(value) == {"runId": "wrun_1", "eventId": "evnt_1"} and " " not in value


def test_it_finalizes_a_hook_to_index_instead_of_releasing_the_token():
    hook = {"runId": "wrun_1", "hookId": "h1", "token": "t1", "createdAt": CREATED, "metadata": b"\x00"}
    calls = index_calls_after_apply_event("wrun_1", {"ok": True, "hookToIndex": hook}, ("t1", {"runId": "wrun_1", "hookId": "h1"}))
    assert len(calls) == 1
    method, (token, hook_id, serialized, owner) = calls[0]
    assert (method, token, hook_id, owner) == ("finalizeHookIndexes", "t1", "h1", {"runId": "wrun_1", "hookId": "h1"})
    assert json.loads(serialized)["createdAt"] == "2026-01-02T03:04:05.678Z"
    assert json.loads(serialized)["metadata"] == {"__type": "Uint8Array", "data": "AA=="}


def test_it_writes_nothing_for_an_outcome_without_entities():
    assert index_calls_after_apply_event("wrun_1", {"ok": True}) == []
