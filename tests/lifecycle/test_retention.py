"""Run retention: policies, tombstones, the sweep, and the guards against recreation (docs/lifecycle.md)."""
from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command

from cells import lifecycle
from cells.lifecycle import cleanup as lifecycle_cleanup
from cells.lifecycle import store as lifecycle_store
from cells.models import (
    Event,
    Hook,
    HookMarker,
    IndexEntry,
    Run,
    RunCellState,
    RunTombstone,
    Step,
    Stream,
    StreamChunk,
    StreamRegistration,
)
from queueing.models import DeadLetter, Message
from tests.lifecycle.support import client_index_puts, enqueue, populate
from tests.runs.support import RunClient
from worldcell import codec
from worldcell.durations import parse_duration_ms

pytestmark = pytest.mark.django_db

DAY = 86_400_000
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def retention(settings):
    """Terminal runs kept 1 day, max age off, no settle delay."""
    settings.WORLDCELL_RUN_RETENTION_MS = DAY
    settings.WORLDCELL_MAX_RUN_AGE_MS = None
    settings.WORLDCELL_RETENTION_BATCH = 128
    settings.WORLDCELL_RETENTION_SETTLE_MS = 0
    return settings


def leftovers(run_id: str) -> dict[str, int]:
    """Rows of ``run_id`` still stored, by kind (a tombstone is not a leftover)."""
    cell = RunCellState.objects.get(name=run_id)
    return {
        "run": Run.objects.filter(cell=cell).count(),
        "events": Event.objects.filter(run_id=cell.pk).count(),
        "steps": Step.objects.filter(run_id=cell.pk).count(),
        "hooks": Hook.objects.filter(run_id=cell.pk).count(),
        "markers": HookMarker.objects.filter(run_id=cell.pk).count(),
        "index": IndexEntry.objects.filter(key__endswith=run_id).count()
        + IndexEntry.objects.filter(key__in=[f"hook:tok-{run_id}", f"hookid:hook_{run_id}", f"hookclaim:tok-{run_id}"]).count(),
        "registry": StreamRegistration.objects.filter(cell=f"run-streams:{run_id}").count(),
        "chunks": StreamChunk.objects.filter(stream__name=f"stream:strm_{run_id}").count(),
        "messages": Message.objects.filter(run_id=run_id).count(),
        "dead_letters": DeadLetter.objects.filter(run_id=run_id).count(),
    }


NOTHING = {k: 0 for k in ("run", "events", "steps", "hooks", "markers", "index", "registry", "chunks",
                          "messages", "dead_letters")}


# --------------------------------------------------------------------------- settings


def test_durations_parse_units_iso_and_off():
    assert parse_duration_ms("30d", "X") == 30 * DAY
    assert parse_duration_ms("1d12h", "X") == 36 * 3_600_000
    assert parse_duration_ms("90m", "X") == 5_400_000
    assert parse_duration_ms("3600", "X") == 3_600_000
    assert parse_duration_ms("P30D", "X") == 30 * DAY
    assert parse_duration_ms("500ms", "X") == 500
    for off in ("", "off", "OFF", " none ", None):
        assert parse_duration_ms(off, "X") is None
    for bad in ("thirty days", "-5s", "5x", "1d-2h"):
        with pytest.raises(ImproperlyConfigured, match="X="):
            parse_duration_ms(bad, "X")


@pytest.mark.parametrize("var,value", [("WORLDCELL_RUN_RETENTION", "a week"), ("WORLDCELL_MAX_RUN_AGE", "12 parsecs"),
                                       ("WORLDCELL_RETENTION_BATCH", "5000"), ("WORLDCELL_RETENTION_DUTY", "0")])
def test_an_unparsable_setting_stops_the_fleet_at_startup(var, value, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTEST_"))}
    env.update({var: value, "WORLDCELL_DATA_DIR": str(tmp_path), "DATABASE_URL": f"sqlite:///{tmp_path}/x.sqlite3"})
    proc = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode != 0
    assert "ImproperlyConfigured" in proc.stderr and var in proc.stderr


def test_the_earlier_deadline_wins():
    t0 = codec.from_epoch_ms(1_000_000_000_000)
    pol = lifecycle.Policy(retention_ms=10 * DAY, max_age_ms=30 * DAY, batch=128)
    assert pol.deadline("completed", t0, t0 + timedelta(days=25)) == (t0 + timedelta(days=30), "maximum-age")
    assert pol.deadline("completed", t0, t0 + timedelta(days=5)) == (t0 + timedelta(days=15), "terminal-retention")
    assert pol.deadline("running", t0, None) == (t0 + timedelta(days=30), "maximum-age")
    assert lifecycle.Policy(retention_ms=10 * DAY, max_age_ms=None, batch=1).deadline("running", t0, None) is None
    assert not lifecycle.Policy(None, None, 128).enabled


# --------------------------------------------------------------------------- the sweep


def test_a_swept_run_leaves_only_its_tombstone(rpc, retention, frozen_clock):
    written = populate(rpc, "wrun_gone")
    populate(rpc, "wrun_kept", complete=False)  # active: terminal retention does not apply
    assert written["messages"] >= 4 and written["index_keys"]
    created = RunClient(rpc, "wrun_gone").get_run()["createdAt"]
    frozen_clock.advance(DAY - 1)
    assert lifecycle.sweep().expired == 0  # not yet due
    frozen_clock.advance(2)
    report = lifecycle.sweep()
    assert (report.expired, report.cleaned, report.failed) == (1, 1, 0)
    assert leftovers("wrun_gone") == NOTHING
    kept = leftovers("wrun_kept")
    assert kept["run"] == 1 and kept["events"] > 0 and kept["hooks"] == 1 and kept["messages"] > 0
    tomb = RunTombstone.objects.get(run_id="wrun_gone")
    assert (tomb.workflow_name, tomb.deployment_id, tomb.status, tomb.reason, tomb.phase) == (
        "wf", "dep", "completed", "terminal-retention", "done")
    assert codec.to_utc_ms(tomb.created_at) == created
    assert codec.to_utc_ms(tomb.expired_at) == codec.to_utc_ms(tomb.completed_at) + timedelta(days=1)
    assert tomb.cleaned_at is not None
    assert tomb.deleted["events"] == 3 * 3 + 4 and tomb.deleted["steps"] == 3 and tomb.deleted["stream_chunks"] == 3
    assert tomb.deleted["messages"] == written["messages"] and tomb.deleted["dead_letters"] == 1
    # the stream row stays, closed, as the fence against late writes
    assert Stream.objects.get(name=f"stream:{written['stream']}").closed is True
    # the kept run's listing keys are all still there
    assert all(IndexEntry.objects.filter(key=k).exists() for k in
               lifecycle.listing_keys("wrun_kept", "wf", RunClient(rpc, "wrun_kept").get_run()["createdAt"]))


def test_an_expired_run_answers_run_expired_and_cannot_be_recreated(rpc, retention, frozen_clock):
    written = populate(rpc, "wrun_gone")
    frozen_clock.advance(DAY + 1)
    lifecycle.sweep()
    run = RunClient(rpc, "wrun_gone")
    expired_at = codec.format_iso(codec.to_utc_ms(RunTombstone.objects.get(run_id="wrun_gone").expired_at))
    message = f'Workflow run "wrun_gone" expired at {expired_at}'
    # reads: 410 RunExpiredError with status 410 (the client rebuilds name and status)
    for method, args in [("getRun", []), ("getStep", ["step_0"]), ("getEvent", ["wevt_z00000000000000000001"]),
                         ("listEvents", [None]), ("listSteps", [None]), ("listHooks", [None])]:
        status, body = rpc("runs", "wrun_gone", method, *args)
        assert status == 410, (method, status, body)
        assert body == {"error": {"name": "RunExpiredError", "message": message, "status": 410}}
    # applyEvent: the RUN_EXPIRED outcome for every event, run_created included; nothing is written
    for args in [("run_created", None, {"deploymentId": "dep", "workflowName": "wf"}),
                 ("run_started",), ("step_created", "step_9", {"stepName": "s"}),
                 ("step_completed", "step_0", {"result": 1}), ("hook_created", "hook_2", {"token": "t2"}),
                 ("run_cancelled",)]:
        args = [a for a in args if a is not None] if args[0] != "run_created" else ["run_created"]
        data = {"deploymentId": "dep", "workflowName": "wf"} if args[0] == "run_created" else None
        outcome = run.apply(*args, **({"eventData": data} if data else {}))
        assert outcome == {"ok": False, "code": "RUN_EXPIRED", "message": message}, args
    assert leftovers("wrun_gone") == NOTHING
    # late index writes of the client (listing, correlation) are refused and not stored
    for key in written["index_keys"]:
        if key.startswith(("run:", "runall:", "correlation:")):
            status, body = rpc("index", "index", "put", key, "{}")
            assert (status, body["error"]["name"]) == (410, "RunExpiredError"), key
    assert rpc.ok("index", "index", "list", {"prefix": "runall:"})["keys"] == []
    # a late hook index, stream registration, stream write, enqueue
    status, _ = rpc("index", "index", "finalizeHookIndexes", "tok-late", "hook_9", "{}",
                    {"runId": "wrun_gone", "hookId": "hook_9"})
    assert status == 410 and not IndexEntry.objects.filter(key="hook:tok-late").exists()
    assert rpc("streams", "run-streams:wrun_gone", "registerStream", "s2")[0] == 410
    status, body = rpc("streams", f"stream:{written['stream']}", "writeChunk", b"late")
    assert (status, body["error"]["message"]) == (500, "Cannot write to a closed stream")
    for queue, payload in [("__wkf_workflow_wf", {"runId": "wrun_gone"}),
                           ("__wkf_step_wf", {"workflowRunId": "wrun_gone", "stepId": "s", "workflowName": "wf"})]:
        assert enqueue(rpc, queue, payload) == {"ok": False, "code": "RUN_EXPIRED", "message": message}
    assert leftovers("wrun_gone") == NOTHING
    # other runs are unaffected by all of this
    other = RunClient(rpc, "wrun_other")
    other.create()
    assert other.get_run()["status"] == "pending"


def test_maximum_age_covers_active_runs_and_the_earlier_deadline_wins(rpc, retention, frozen_clock, settings):
    settings.WORLDCELL_RUN_RETENTION_MS = 10 * DAY
    settings.WORLDCELL_MAX_RUN_AGE_MS = 3 * DAY
    populate(rpc, "wrun_active", complete=False)
    frozen_clock.advance(2 * DAY)
    populate(rpc, "wrun_young")
    frozen_clock.advance(DAY + 1)
    report = lifecycle.sweep()
    assert report.expired == 1
    tomb = RunTombstone.objects.get(run_id="wrun_active")
    assert (tomb.status, tomb.reason) == ("running", "maximum-age")
    assert leftovers("wrun_active") == NOTHING
    assert leftovers("wrun_young")["run"] == 1
    frozen_clock.advance(2 * DAY)  # young: created 3 days ago; its 10-day retention would be later
    assert lifecycle.sweep().expired == 1
    assert RunTombstone.objects.get(run_id="wrun_young").reason == "maximum-age"


def test_the_sweep_is_bounded_by_the_batch_and_continues(rpc, retention, frozen_clock, settings):
    settings.WORLDCELL_RETENTION_BATCH = 2
    for i in range(5):
        populate(rpc, f"wrun_{i}", steps=1, hook=False, chunks=0)
    frozen_clock.advance(DAY + 1)
    counts = []
    for _ in range(4):
        r = lifecycle.sweep()
        counts.append((r.expired, r.more))
    assert counts == [(2, True), (2, True), (1, False), (0, False)]
    assert RunTombstone.objects.filter(phase="done").count() == 5


def test_dry_run_lists_and_writes_nothing(rpc, retention, frozen_clock, capsys):
    populate(rpc, "wrun_a", steps=1)
    frozen_clock.advance(DAY + 1)
    report = lifecycle.sweep(dry_run=True)
    assert [c["runId"] for c in report.candidates] == ["wrun_a"]
    call_command("retention", "--dry-run")
    out = capsys.readouterr().out
    assert "wrun_a  completed" in out and "1 run(s) would expire" in out
    assert not RunTombstone.objects.exists() and leftovers("wrun_a")["events"] > 0
    call_command("retention")
    out = capsys.readouterr().out
    assert "WORLDCELL_RUN_RETENTION): 1d" in out and "tombstones: 0" in out
    call_command("retention", "--now")
    assert "expired 1, finished 1 cleanup(s)" in capsys.readouterr().out
    call_command("retention")
    out = capsys.readouterr().out
    assert "tombstones: 1 (0 still being cleaned)" in out and "expired 1, cleaned 1" in out


def test_a_crash_mid_cleanup_resumes_and_the_run_never_looks_whole(rpc, retention, frozen_clock, monkeypatch):
    monkeypatch.setattr(lifecycle_cleanup, "PAGE", 2)  # many small pages
    populate(rpc, "wrun_crash", steps=4)
    events = Event.objects.filter(run__cell__name="wrun_crash").count()
    frozen_clock.advance(DAY + 1)
    real = lifecycle_store.delete_index_keys
    calls = {"n": 0}

    def crash_on_third_page(keys):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("power cut")
        return real(keys)

    monkeypatch.setattr(lifecycle_store, "delete_index_keys", crash_on_third_page)
    report = lifecycle.sweep()
    assert (report.expired, report.failed) == (1, 1)
    tomb = RunTombstone.objects.get(run_id="wrun_crash")
    assert tomb.phase == "events" and "power cut" in tomb.last_error
    left = leftovers("wrun_crash")
    assert 0 < left["events"] < events and left["run"] == 1  # half deleted ...
    run = RunClient(rpc, "wrun_crash")
    assert rpc("runs", "wrun_crash", "getRun")[0] == 410  # ... but never answered as a whole run
    assert rpc("runs", "wrun_crash", "listEvents", None)[0] == 410
    assert run.apply("step_created", "step_x", {"stepName": "s"})["code"] == "RUN_EXPIRED"
    monkeypatch.setattr(lifecycle_store, "delete_index_keys", real)
    report = lifecycle.sweep()
    assert (report.resumed, report.cleaned, report.failed) == (1, 1, 0)
    tomb.refresh_from_db()
    assert tomb.phase == "done" and tomb.deleted["events"] == events and tomb.attempts == 2
    assert leftovers("wrun_crash") == NOTHING


def test_late_writes_in_flight_at_expiry_are_removed_by_the_settle_pass(rpc, retention, frozen_clock, settings):
    settings.WORLDCELL_RETENTION_SETTLE_MS = 60_000
    populate(rpc, "wrun_late", steps=1)
    frozen_clock.advance(DAY + 1)
    report = lifecycle.sweep()
    assert (report.expired, report.cleaned, report.waiting) == (1, 0, 1)
    assert RunTombstone.objects.get(run_id="wrun_late").phase == "settle"
    # writes that passed their guard just before the tombstone committed land afterwards
    run_created = codec.to_utc_ms(RunTombstone.objects.get(run_id="wrun_late").created_at)
    key = lifecycle.listing_keys("wrun_late", "wf", run_created)[1]
    IndexEntry.objects.create(cell="index", key=key, value=codec.encode("{}"))
    queue_cell = Message.objects.model._meta.get_field("cell").related_model.objects.get(name="q:0")
    Message.objects.create(cell=queue_cell, message_id="msg_late", queue_name="__wkf_step_wf", pathname="step",
                           body=codec.encode("{}"), target_base_url="http://x", enqueued_at=1, due_at=1,
                           updated_at=1, run_id="wrun_late")
    frozen_clock.advance(30_000)
    assert lifecycle.sweep().cleaned == 0  # still settling
    frozen_clock.advance(30_001)
    assert lifecycle.sweep().cleaned == 1
    assert leftovers("wrun_late") == NOTHING
    # and a message that slips in after that is a straggler the next sweep removes
    Message.objects.create(cell=queue_cell, message_id="msg_later", queue_name="__wkf_step_wf", pathname="step",
                           body=codec.encode("{}"), target_base_url="http://x", enqueued_at=1, due_at=1,
                           updated_at=1, run_id="wrun_late")
    assert lifecycle.sweep().stragglers == 1
    assert not Message.objects.filter(run_id="wrun_late").exists()


def test_retention_off_sweeps_nothing(rpc, settings, frozen_clock):
    settings.WORLDCELL_RUN_RETENTION_MS = None
    settings.WORLDCELL_MAX_RUN_AGE_MS = None
    populate(rpc, "wrun_forever", steps=1)
    frozen_clock.advance(10_000 * DAY)
    report = lifecycle.sweep()
    assert (report.enabled, report.expired) == (False, 0)
    assert leftovers("wrun_forever")["run"] == 1


def test_queue_rows_carry_their_run(rpc):
    RunClient(rpc, "wrun_q").create()
    enqueue(rpc, "__wkf_workflow_wf", {"runId": "wrun_q", "traceCarrier": {"a": "b"}})
    enqueue(rpc, "__wkf_step_wf", {"workflowRunId": "wrun_q", "stepId": "s", "workflowName": "wf"})
    enqueue(rpc, "other_queue", {"runId": "wrun_q"})
    enqueue(rpc, "__wkf_workflow_wf", {"notARun": 1})
    assert sorted((m.queue_name, m.run_id or "") for m in Message.objects.all()) == [
        ("__wkf_step_wf", "wrun_q"), ("__wkf_workflow_wf", ""), ("__wkf_workflow_wf", "wrun_q"),
        ("other_queue", "")]


def test_listing_keys_of_live_runs_are_stored_as_before(rpc):
    run = RunClient(rpc, "wrun_live")
    keys = client_index_puts(rpc, "wrun_live", run.create())
    assert [k["name"] for k in rpc.ok("index", "index", "list", {"prefix": "run"})["keys"]] == sorted(keys)


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_concurrent_events_and_reads_never_outlive_the_fence(rpc, retention, settings, monkeypatch):
    """Writers and readers hammer an active run while the sweep expires it (maximum age) on PostgreSQL.

    Every answer after a thread's first "expired" is "expired" too, no read
    ever returns a run without its events, and nothing written survives.
    """
    import threading

    from django.db import connection as conn

    from cells.runs import RunCell
    from worldcell.errors import CellError

    settings.WORLDCELL_MAX_RUN_AGE_MS = 0
    settings.WORLDCELL_RUN_RETENTION_MS = None
    monkeypatch.setattr(lifecycle_cleanup, "PAGE", 3)
    run_id = "wrun_race"
    populate(rpc, run_id, steps=5, complete=False, chunks=2)
    stop = threading.Event()
    errors: list[str] = []
    seen: dict[str, list[str]] = {}

    def writer(n: int):
        cell, answers, i = RunCell(run_id), [], 0
        try:
            while not stop.is_set():
                i += 1
                out = cell.apply_event({"runId": run_id, "data": {"eventType": "step_created",
                                                                   "correlationId": f"w{n}_{i}",
                                                                   "eventData": {"stepName": "s"}}})
                answers.append("ok" if out["ok"] else out["code"])
        except BaseException as exc:  # noqa: BLE001
            errors.append(repr(exc))
        finally:
            seen[f"w{n}"] = answers
            conn.close()

    def reader(n: int):
        cell, answers = RunCell(run_id), []
        try:
            while not stop.is_set():
                try:
                    run = cell.get_run()
                    events = cell.list_events({"limit": 1})["data"]
                    answers.append("ok" if run is not None and events else "partial")
                except CellError as exc:
                    answers.append(exc.name)
        except BaseException as exc:  # noqa: BLE001
            errors.append(repr(exc))
        finally:
            seen[f"r{n}"] = answers
            conn.close()

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(3)]
    threads += [threading.Thread(target=reader, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    threading.Event().wait(0.3)
    report = lifecycle.sweep()
    assert report.expired == 1
    for _ in range(100):  # small pages: the cleanup takes several ticks, the threads go on meanwhile
        if RunTombstone.objects.get(run_id=run_id).phase == "done":
            break
        lifecycle.sweep()
    stop.set()
    for t in threads:
        t.join(20)
    assert errors == []
    for name, answers in seen.items():
        assert answers, name
        expired = "RUN_EXPIRED" if name.startswith("w") else "RunExpiredError"
        first = answers.index(expired)  # every thread saw the fence ...
        assert set(answers[first:]) == {expired}, name  # ... and nothing else after it
        assert "partial" not in answers, name  # and never a run without its events
        assert set(answers[:first]) <= {"ok", "ENTITY_CONFLICT"}, name
    assert leftovers(run_id) == NOTHING
    tomb = RunTombstone.objects.get(run_id=run_id)
    assert tomb.deleted["steps"] == 5 + sum(a.count("ok") for n, a in seen.items() if n.startswith("w"))


def test_runs_waiting_to_settle_do_not_block_the_batch(rpc, retention, frozen_clock, settings):
    settings.WORLDCELL_RETENTION_BATCH = 2
    settings.WORLDCELL_RETENTION_SETTLE_MS = 60_000
    for i in range(5):
        populate(rpc, f"wrun_s{i}", steps=1, hook=False, chunks=0)
    frozen_clock.advance(DAY + 1)
    assert [lifecycle.sweep().expired for _ in range(4)] == [2, 2, 1, 0]
    assert RunTombstone.objects.filter(phase="settle").count() == 5
    frozen_clock.advance(60_001)
    assert [lifecycle.sweep().cleaned for _ in range(4)] == [2, 2, 1, 0]
    assert RunTombstone.objects.filter(phase="done").count() == 5
