"""``listEvents`` (P1) and ``listSteps``/``listHooks`` (P2) pages (docs/protocol.md §4.0, §4.1, §11.7–11.9)."""
import pytest

from cells.event_machine import format_event_id
from cells.models import Event, RunCellState
from worldcell import codec

from .support import RunClient, page_through

pytestmark = pytest.mark.django_db


def _events(run, count: int) -> list[str]:
    """A run with ``count`` events; returns their ids."""
    run.create()
    for i in range(count - 1):
        run.ok("wait_completed", f"w{i}")
    ids = run.event_ids()
    assert len(ids) == count
    return ids


def test_an_unused_run_lists_nothing(rpc):
    run = RunClient(rpc, "wrun_never_used")
    empty = {"data": [], "cursor": None, "hasMore": False}
    assert run.list_events() == empty
    assert run.list_steps() == empty
    assert run.list_hooks(None) == empty
    assert rpc.ok("runs", "wrun_never_used", "listEvents") == empty


def test_it_pages_events_ascending(run):
    ids = _events(run, 8)
    first = run.list_events({"limit": 3})
    assert [e["eventId"] for e in first["data"]] == ids[:3]
    assert first["cursor"] == ids[2] and first["hasMore"] is True
    seen = page_through(run.list_events, 3)
    assert [e["eventId"] for e in seen] == ids == sorted(set(ids))


def test_it_pages_events_descending(run):
    ids = _events(run, 5)
    first = run.list_events({"limit": 3, "sortOrder": "desc"})
    assert [e["eventId"] for e in first["data"]] == ids[::-1][:3]
    assert first["hasMore"] is True
    second = run.list_events({"limit": 3, "sortOrder": "desc", "cursor": first["cursor"]})
    assert [e["eventId"] for e in second["data"]] == ids[::-1][3:]
    assert second == {"data": second["data"], "cursor": None, "hasMore": False}


def test_a_descending_page_starts_strictly_below_the_cursor(run):
    ids = _events(run, 6)
    page = run.list_events({"limit": 2, "sortOrder": "desc", "cursor": "wevt_z00000000000000000005"})
    assert [e["eventId"] for e in page["data"]] == [ids[3], ids[2]]
    assert page["cursor"] == "wevt_z00000000000000000003" and page["hasMore"] is True


def test_a_page_that_ends_at_the_last_event_has_no_cursor(run):
    _events(run, 4)
    page = run.list_events({"limit": 4})
    assert (len(page["data"]), page["cursor"], page["hasMore"]) == (4, None, False)


def test_a_zero_limit_reports_whether_anything_exists(run):
    assert run.list_events({"limit": 0}) == {"data": [], "cursor": None, "hasMore": False}
    _events(run, 2)
    assert run.list_events({"limit": 0}) == {"data": [], "cursor": None, "hasMore": True}
    assert run.list_steps({"limit": 0}) == {"data": [], "cursor": None, "hasMore": False}


def test_an_unknown_sort_order_is_ascending(run):
    ids = _events(run, 3)
    assert [e["eventId"] for e in run.list_events({"sortOrder": "sideways"})["data"]] == ids


def test_an_empty_or_null_cursor_starts_from_the_beginning(run):
    ids = _events(run, 3)
    for cursor in ("", None):
        assert [e["eventId"] for e in run.list_events({"cursor": cursor})["data"]] == ids
        assert [e["eventId"] for e in run.list_events({"cursor": cursor, "sortOrder": "desc"})["data"]] == ids[::-1]


def test_cursors_compare_as_strings(run):
    ids = _events(run, 12)
    # "wevt_z0000000000000000001" (one digit short) sorts between …0001 and …0010
    page = run.list_events({"cursor": "wevt_z0000000000000000001"})
    assert [e["eventId"] for e in page["data"]] == ids[9:]
    assert run.list_events({"cursor": "zzz"})["data"] == []
    assert [e["eventId"] for e in run.list_events({"cursor": "zzz", "sortOrder": "desc"})["data"]] == ids[::-1]


def test_default_limits(run, frozen_clock):
    run.create()
    for i in range(120):
        run.ok("wait_completed", f"w{i}")
    assert len(run.list_events()["data"]) == 100
    for i in range(25):
        run.step(f"s{i:02d}")
    steps = run.list_steps()
    assert len(steps["data"]) == 20 and steps["hasMore"] is True
    assert steps["cursor"] == "2026-01-02T03:04:05.678Z:s19"


@pytest.mark.parametrize("params", [{"limit": -1}, {"limit": 1.5}, {"limit": "3"}, {"limit": True},
                                    {"cursor": 5}, "limit=3", [1]])
def test_it_rejects_bad_page_parameters(run, params):
    for method in ("listEvents", "listSteps", "listHooks"):
        status, body = run.rpc("runs", run.run_id, method, params)
        assert (status, body["error"]["name"]) == (400, "ValidationError"), (method, params, body)


def test_it_pages_steps_by_creation_time_then_id(run, frozen_clock):
    run.create()
    for step_id in ("z-first-step", "z-second-step", "a-third-step"):
        frozen_clock.advance(2)
        run.step(step_id)
    asc = [s["stepId"] for s in run.list_steps()["data"]]
    assert asc == ["z-first-step", "z-second-step", "a-third-step"]
    desc = [s["stepId"] for s in run.list_steps({"sortOrder": "desc"})["data"]]
    assert desc == asc[::-1]


def test_a_step_cursor_is_the_iso_time_and_id(run, frozen_clock):
    run.create()
    frozen_clock.ms = 1_796_033_600_053  # 2026-11-30T10:13:20.053Z
    run.step("zeta")
    frozen_clock.advance(7)
    run.step("alpha")
    frozen_clock.advance(1)
    run.step("beta")
    first = run.list_steps({"limit": 1})
    assert [s["stepId"] for s in first["data"]] == ["zeta"]
    assert first["cursor"] == "2026-11-30T10:13:20.053Z:zeta" and first["hasMore"] is True
    second = run.list_steps({"limit": 1, "cursor": first["cursor"]})
    assert [s["stepId"] for s in second["data"]] == ["alpha"]
    assert second["cursor"] == "2026-11-30T10:13:20.060Z:alpha" and second["hasMore"] is True
    last = run.list_steps({"limit": 1, "cursor": second["cursor"]})
    assert [s["stepId"] for s in last["data"]] == ["beta"]
    assert (last["cursor"], last["hasMore"]) == (None, False)
    # any string is a valid cursor: it is compared with the keys bytewise
    assert [s["stepId"] for s in run.list_steps({"cursor": "2026-11-30T10:13:20.060Z"})["data"]] == ["alpha", "beta"]
    assert [s["stepId"] for s in run.list_steps({"cursor": "2026-11-30T10:13:20.060Z:b"})["data"]] == ["beta"]


def test_five_steps_page_in_three_pages(run):
    run.create()
    for i in range(5):
        run.step(f"s{i}")
    pages = []
    cursor = None
    while True:
        page = run.list_steps({"limit": 2, "cursor": cursor})
        pages.append([s["stepId"] for s in page["data"]])
        if not page["hasMore"]:
            break
        cursor = page["cursor"]
    assert pages == [["s0", "s1"], ["s2", "s3"], ["s4"]]


def test_250_steps_in_one_millisecond_page_without_skips_or_repeats(run, frozen_clock):
    run.create()
    ids = [f"step-{i:03d}-{'xyz'[i % 3]}" for i in range(250)]
    for step_id in reversed(ids):  # created in the opposite order of their ids
        run.step(step_id)
    for sort_order in ("asc", "desc"):
        for limit in (1, 7, 249, 250, 1000):
            seen = [s["stepId"] for s in page_through(run.list_steps, limit, sort_order)]
            assert len(seen) == len(set(seen)) == 250
            assert seen == (sorted(ids) if sort_order == "asc" else sorted(ids, reverse=True)), (sort_order, limit)


def test_250_hooks_in_one_millisecond_page_without_skips_or_repeats(run, frozen_clock):
    run.create()
    ids = [f"hook-{i:03d}" for i in range(250)]
    for hook_id in ids[::2] + ids[1::2]:
        run.hook(hook_id, "tok-" + hook_id)
    for sort_order in ("asc", "desc"):
        for limit in (1, 9, 250):
            seen = [h["hookId"] for h in page_through(run.list_hooks, limit, sort_order)]
            assert seen == (ids if sort_order == "asc" else ids[::-1]), (sort_order, limit)


def test_disposed_hooks_leave_the_list(run):
    run.create()
    for i in range(5):
        run.hook(f"h{i}", f"t{i}")
    run.ok("hook_disposed", "h2")
    assert [h["hookId"] for h in page_through(run.list_hooks, 2)] == ["h0", "h1", "h3", "h4"]


def test_run_started_preloads_at_most_1000_events(run, frozen_clock):
    run.create()
    cell = RunCellState.objects.get(name=run.run_id)
    # 1099 more events written directly (through the route this takes ~10 s)
    Event.objects.bulk_create(
        Event(run_id=cell.pk, event_id=format_event_id(n), sequence=n, event_type="wait_completed",
              correlation_id=f"w{n}", created_at=frozen_clock.now,
              body=codec.encode({"eventType": "wait_completed", "correlationId": f"w{n}", "runId": run.run_id,
                                 "eventId": format_event_id(n), "createdAt": frozen_clock.now, "specVersion": 3}))
        for n in range(2, 1101)
    )
    RunCellState.objects.filter(pk=cell.pk).update(event_sequence=1100)
    outcome = run.ok("run_started")
    assert outcome["event"]["eventId"] == format_event_id(1101)
    assert len(outcome["events"]) == 1000
    assert outcome["events"][0]["eventType"] == "run_created"
    assert [e["eventId"] for e in outcome["events"]] == [format_event_id(n) for n in range(1, 1001)]
    assert "cursor" not in outcome and "hasMore" not in outcome


def test_keys_order_by_code_point_not_by_locale(run, frozen_clock):
    run.create()
    ids = ["a", "B", "\U0001f600", "é", "Z", "\ue000", "b"]
    for step_id in ids:
        run.step(step_id)
        run.hook(step_id, "tok-" + step_id)
    expected = sorted(ids)  # Python compares code points = UTF-8 bytes
    assert expected == ["B", "Z", "a", "b", "é", "\ue000", "\U0001f600"]
    assert [s["stepId"] for s in page_through(run.list_steps, 2)] == expected
    assert [h["hookId"] for h in page_through(run.list_hooks, 3, "desc")] == expected[::-1]
    finished = run.ok("run_completed", event_data={})
    assert [h["hookId"] for h in finished["releasedHooks"]] == expected


@pytest.mark.postgres_only
def test_range_scanned_keys_use_the_c_collation_on_postgres():
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "SELECT table_name, column_name, collation_name FROM information_schema.columns "
            "WHERE table_name IN ('cells_step', 'cells_hook', 'cells_event') "
            "AND column_name IN ('sort_key', 'event_id')"
        )
        found = {(table, column): collation for table, column, collation in cur.fetchall()}
    assert found == {("cells_step", "sort_key"): "C", ("cells_hook", "sort_key"): "C",
                     ("cells_event", "event_id"): "C"}


@pytest.mark.parametrize("limit", [2**31 - 2, 2**31, 2**53, 2**63 - 1, 2**64, 10**30])
def test_a_huge_limit_is_clamped_to_a_normal_page(run, limit):
    # Regression: limit + 1 went to the database as is (500 "bigint out of range"
    # on PostgreSQL, "datatype mismatch" on SQLite); it is clamped like index.list.
    run.create()
    run.step("s1")
    run.hook("h1", "t1")
    for method in ("listEvents", "listSteps", "listHooks"):
        for order in ("asc", "desc"):
            page = run.call(method, {"limit": limit, "sortOrder": order})
            assert len(page["data"]) >= 1 and page["cursor"] is None and page["hasMore"] is False, (method, page)
    page = run.list_events({"limit": limit, "cursor": "wevt_z00000000000000000001"})
    assert [e["eventType"] for e in page["data"]] == ["step_created", "hook_created"]
