"""The run list and the run page of the operator console (docs/architecture.md "What operators see").

Runs are written through the real RPC route, the way the world-celld client
writes them (``ClientSequence``), then read through the admin with the
Django test client.
"""
from __future__ import annotations

import re
from datetime import datetime, timezone

import pytest

from cells.models import Run, Step

from .support import RUNS, ClientSequence

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(rpc, frozen_clock):
    """Three runs of two workflows on two deployments, 1 s apart; ``world.seq`` applies more events."""
    seq = ClientSequence(rpc)
    seq.create_run("wrun_A", workflow="wf-order", deployment="dpl_1")
    seq.start_run("wrun_A")
    frozen_clock.advance(1000)
    seq.create_run("wrun_B", workflow="wf-order", deployment="dpl_2")
    seq.start_run("wrun_B")
    seq.apply("wrun_B", "run_completed", output={"total": 42})
    frozen_clock.advance(1000)
    seq.create_run("wrun_C", workflow="wf-refund", deployment="dpl_2")
    seq.start_run("wrun_C")
    seq.apply("wrun_C", "step_created", "step_charge", stepName="charge", input=[1])
    seq.apply("wrun_C", "step_started", "step_charge")
    seq.apply("wrun_C", "step_failed", "step_charge", error={"message": "card declined", "code": "E_CARD"})
    seq.apply("wrun_C", "run_failed", error={"message": "refund failed"}, errorCode="E_REFUND")

    class World:
        pass

    w = World()
    w.seq, w.clock = seq, frozen_clock
    return w


def listed_run_ids(response) -> list[str]:
    """Run ids in the order the run list shows them."""
    assert response.status_code == 200, response.status_code
    return re.findall(r'<th class="field-run_id"><a href="[^"]+">(wrun_[A-Za-z0-9_]+)</a>', response.content.decode())


def run_page(admin_client, run_id: str, query: str = ""):
    pk = Run.objects.get(cell__name=run_id).pk
    response = admin_client.get(f"{RUNS}{pk}/change/{query}")
    assert response.status_code == 200, response.status_code
    return response.content.decode()


# --------------------------------------------------------------------------- the list


def test_it_lists_runs_newest_first_with_workflow_status_deployment_created_and_duration(admin_client, world):
    response = admin_client.get(RUNS)
    assert listed_run_ids(response) == ["wrun_C", "wrun_B", "wrun_A"]
    html = response.content.decode()
    assert '<span class="wc-badge wc-badge-failed">failed</span>' in html
    assert '<span class="wc-badge wc-badge-completed">completed</span>' in html
    assert '<span class="wc-badge wc-badge-running">running</span>' in html
    assert "wf-refund" in html and "dpl_2" in html
    assert "2026-01-02 03:04:07.678" in html  # wrun_C created 2 s after the clock's start
    assert "0 ms" in html  # the completed run took no time on the frozen clock
    assert "3 runs" in html


@pytest.mark.parametrize(
    "query, expected",
    [
        ("?status__exact=running", ["wrun_A"]),
        ("?status__exact=completed", ["wrun_B"]),
        ("?status__exact=failed", ["wrun_C"]),
        ("?workflow_name=wf-order", ["wrun_B", "wrun_A"]),
        ("?workflow_name=wf-refund", ["wrun_C"]),
        ("?deployment_id=dpl_2", ["wrun_C", "wrun_B"]),
        ("?deployment_id=dpl_1&status__exact=running", ["wrun_A"]),
        ("?created_at__gte=2026-01-02+03:04:06.500%2B00:00", ["wrun_C", "wrun_B"]),
        ("?created_at__gte=2026-01-02+00:00:00%2B00:00&created_at__lt=2026-01-03+00:00:00%2B00:00",
         ["wrun_C", "wrun_B", "wrun_A"]),
        ("?created_at__gte=2026-01-03+00:00:00%2B00:00", []),
    ],
)
def test_it_filters_runs_by_status_workflow_deployment_and_created_date(admin_client, world, query, expected):
    assert listed_run_ids(admin_client.get(RUNS + query)) == expected


def test_it_offers_the_distinct_workflow_names_and_deployments_as_filter_choices(admin_client, world):
    html = admin_client.get(RUNS).content.decode()
    assert 'href="?workflow_name=wf-order"' in html and 'href="?workflow_name=wf-refund"' in html
    assert 'href="?deployment_id=dpl_1"' in html and 'href="?deployment_id=dpl_2"' in html
    assert 'href="?status__exact=cancelled"' in html
    assert "Past 7 days" in html  # the created-date filter


@pytest.mark.parametrize(
    "term, expected",
    [
        ("wrun_B", ["wrun_B"]),  # run id
        ("wf-refund", ["wrun_C"]),  # workflow name
        ("step_charge", ["wrun_C"]),  # step id
        ("dpl_1", ["wrun_A"]),  # deployment
        ("nothing-like-this", []),
    ],
)
def test_it_searches_runs_by_run_id_workflow_name_step_id_and_deployment(admin_client, world, term, expected):
    assert listed_run_ids(admin_client.get(RUNS, {"q": term})) == expected


def test_it_searches_runs_by_hook_token_and_hook_id(admin_client, world):
    world.seq.apply("wrun_A", "hook_created", "hook_approve", token="approve-token-123")
    assert listed_run_ids(admin_client.get(RUNS, {"q": "approve-token-123"})) == ["wrun_A"]
    assert listed_run_ids(admin_client.get(RUNS, {"q": "hook_approve"})) == ["wrun_A"]


def test_it_never_loads_payload_columns_for_the_list(admin_client, world, django_assert_max_num_queries):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as ctx:
        admin_client.get(RUNS)
    page_queries = [q["sql"] for q in ctx.captured_queries if "cells_run" in q["sql"] and "LIMIT" in q["sql"]]
    assert page_queries, ctx.captured_queries
    for sql in page_queries:
        assert '"cells_run"."output"' not in sql and '"cells_run"."input"' not in sql


# --------------------------------------------------------------------------- the run page


def test_it_shows_the_run_summary_steps_timeline_and_decoded_payloads(admin_client, world):
    html = run_page(admin_client, "wrun_C")
    assert "Run wrun_C" in html
    assert "wf-refund" in html and "dpl_2" in html
    # the step with status, attempt and its error
    assert 'href="/admin/cells/run/' in html and "step/?id=step_charge" in html
    assert "charge" in html and "card declined" in html and "E_CARD" in html
    # the run error, decoded
    assert "refund failed" in html and "E_REFUND" in html
    # the event log, in order, with links to the step it concerns
    types = re.findall(r'<td class="wc-evtype">(\w+)</td>', html)
    assert types == ["run_created", "run_started", "step_created", "step_started", "step_failed", "run_failed"]
    assert html.count("step/?id=step_charge") >= 4  # step table + three step events
    assert "6 events" in html


def test_it_shows_hooks_with_token_webhook_flag_and_metadata(admin_client, world):
    world.seq.apply("wrun_A", "hook_created", "hook_1", token="tok-one", metadata={"purpose": "approval"})
    world.seq.apply("wrun_A", "hook_created", "hook_2", token="tok-two", isWebhook=True)
    world.seq.apply("wrun_A", "hook_disposed", "hook_2")
    html = run_page(admin_client, "wrun_A")
    assert "tok-one" in html and "approval" in html
    assert "1 live of 2 created" in html
    assert "hook no longer live" in html  # the timeline's hook_2 events
    hook_anchor = re.search(r'<tr id="(hook-\d+)">', html).group(1)
    assert f'href="#{hook_anchor}"' in html  # hook_1's events link to its row


def test_it_decodes_bytes_dates_and_nul_in_payloads(admin_client, rpc, frozen_clock):
    seq = ClientSequence(rpc)
    when = datetime(2030, 5, 6, 7, 8, 9, 10000, tzinfo=timezone.utc)
    seq.create_run("wrun_P", input=[b"\x00\x01\x02\xff", b"hello bytes", when, "nul\x00inside", {"n": 1.5}])
    html = run_page(admin_client, "wrun_P")
    assert "Uint8Array(4 bytes)" in html and "00 01 02 ff" in html
    assert "Uint8Array(11 bytes)" in html and "&quot;hello bytes&quot;" in html
    assert "Date </span><span class=\"wc-date\">2030-05-06T07:08:09.010Z" in html
    assert "&quot;nul\\u0000inside&quot;" in html
    assert "absent" in html  # output and error are absent on a pending run


def test_it_truncates_a_5_mb_output_and_shows_its_full_size(admin_client, rpc, frozen_clock):
    seq = ClientSequence(rpc)
    seq.create_run("wrun_BIG")
    seq.start_run("wrun_BIG")
    big = b"0123456789abcdef" * 327_680  # 5 MiB
    seq.apply("wrun_BIG", "run_completed", output=big)
    assert len(Run.objects.get(cell__name="wrun_BIG").output) > 6_000_000
    html = run_page(admin_client, "wrun_BIG")
    assert "Uint8Array(5,242,880 bytes)" in html
    assert "preview truncated" in html and "6,990,541 bytes" in html  # the stored size
    assert "&quot;0123456789abcdef" in html  # a UTF-8 preview of the first bytes
    assert len(html) < 300_000  # neither the output nor the run_completed event body is sent whole


def test_it_truncates_a_5_mb_string_output_and_step_result(admin_client, rpc, frozen_clock):
    seq = ClientSequence(rpc)
    seq.create_run("wrun_STR")
    seq.start_run("wrun_STR")
    seq.apply("wrun_STR", "step_created", "s1", stepName="produce")
    seq.apply("wrun_STR", "step_started", "s1")
    seq.apply("wrun_STR", "step_completed", "s1", result="x" * 5_000_000)
    seq.apply("wrun_STR", "run_completed", output={"report": "y" * 5_000_000})
    html = run_page(admin_client, "wrun_STR")
    assert "preview truncated" in html and len(html) < 300_000
    step_pk_page = admin_client.get(f"{RUNS}{Run.objects.get(cell__name='wrun_STR').pk}/step/", {"id": "s1"})
    assert step_pk_page.status_code == 200
    step_html = step_pk_page.content.decode()
    assert "preview truncated" in step_html and len(step_html) < 200_000


def test_it_lists_the_runs_streams_with_chunk_counts_and_first_and_last_chunks(admin_client, rpc, world):
    rpc.ok("streams", "run-streams:wrun_A", "registerStream", "strm_log")
    for chunk in (b"first line\n", b"\x00\x9f\xff binary middle", b"last line\n"):
        rpc.ok("streams", "stream:strm_log", "writeChunk", chunk)
    rpc.ok("streams", "stream:strm_log", "closeStream")
    rpc.ok("streams", "run-streams:wrun_A", "registerStream", "strm_empty")
    html = run_page(admin_client, "wrun_A")
    section = html[html.index('id="streams"'):]
    assert "strm_log" in section and "<td>3</td>" in section
    assert "&quot;first line\\n&quot;" in section and "&quot;last line\\n&quot;" in section
    assert "closed" in section
    assert "nothing was written to stream:strm_empty yet" in section


def test_it_shows_the_step_page_with_payloads_and_its_events(admin_client, world):
    world.seq.apply("wrun_A", "step_created", "step_x", stepName="ship", input={"box": b"\x01\x02"})
    world.seq.apply("wrun_A", "step_started", "step_x")
    retry_at = datetime(2026, 1, 2, 3, 10, 0, tzinfo=timezone.utc)
    world.seq.apply("wrun_A", "step_retrying", "step_x", error={"message": "timeout"}, retryAfter=retry_at)
    pk = Run.objects.get(cell__name="wrun_A").pk
    response = admin_client.get(f"{RUNS}{pk}/step/", {"id": "step_x"})
    assert response.status_code == 200
    html = response.content.decode()
    assert "Step step_x" in html and "ship" in html
    assert "Uint8Array(2 bytes)" in html and "timeout" in html
    assert "2026-01-02 03:10:00.000" in html  # retry after
    assert re.findall(r'<td class="wc-evtype">(\w+)</td>', html) == ["step_created", "step_started", "step_retrying"]
    # the run page shows retryAfter and the step's attempt too
    run_html = run_page(admin_client, "wrun_A")
    row = run_html[run_html.index("<tr id=\"step-"):]
    row = row[: row.index("</tr>")]
    assert "2026-01-02 03:10:00.000" in row and "<td>1</td>" in row and "timeout" in row


def test_it_shows_an_event_page_with_the_whole_decoded_event(admin_client, world):
    pk = Run.objects.get(cell__name="wrun_C").pk
    response = admin_client.get(f"{RUNS}{pk}/event/wevt_z00000000000000000005/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "step_failed" in html and "card declined" in html and "step/?id=step_charge" in html


def test_it_answers_404_for_an_unknown_run_step_or_event(admin_client, world):
    pk = Run.objects.get(cell__name="wrun_C").pk
    assert admin_client.get(f"{RUNS}999999/change/").status_code == 302  # the admin's "does not exist" redirect
    assert admin_client.get(f"{RUNS}{pk}/step/", {"id": "nope"}).status_code == 404
    assert admin_client.get(f"{RUNS}{pk}/event/wevt_z99/").status_code == 404
    assert admin_client.get(f"{RUNS}by-id/wrun_nope/").status_code == 404


def test_it_redirects_a_run_id_link_to_the_run_page(admin_client, world):
    pk = Run.objects.get(cell__name="wrun_B").pk
    response = admin_client.get(f"{RUNS}by-id/wrun_B/")
    assert response.status_code == 302 and response["Location"] == f"{RUNS}{pk}/change/"


def test_it_pages_through_a_long_event_log_and_many_steps(admin_client, rpc, frozen_clock):
    seq = ClientSequence(rpc)
    seq.create_run("wrun_LONG")
    seq.start_run("wrun_LONG")
    for i in range(255):
        seq.apply("wrun_LONG", "step_created", f"s{i:03d}", stepName="work")
    html = run_page(admin_client, "wrun_LONG")
    assert "257 events" in html and "255 in creation order" in html
    steps = html[html.index('id="steps"'):html.index('id="timeline"')]
    timeline = html[html.index('id="timeline"'):html.index('id="hooks"')]
    assert steps.count("step/?id=s") == 100 and timeline.count("step/?id=s") == 248  # 250 events - 2 run events
    next_steps = re.search(r'href="[^"]*(\?steps_after=[^"#]+)#steps"', steps).group(1)
    next_events = re.search(r'href="[^"]*(\?events_after=[^"#]+)#timeline"', timeline).group(1)

    second = run_page(admin_client, "wrun_LONG", next_steps.replace("&amp;", "&"))
    steps = second[second.index('id="steps"'):second.index('id="timeline"')]
    assert steps.count("step/?id=s") == 100 and "step/?id=s100" in steps and "step/?id=s099" not in steps and "step/?id=s200" not in steps

    tail = run_page(admin_client, "wrun_LONG", next_events.replace("&amp;", "&"))
    timeline = tail[tail.index('id="timeline"'):tail.index('id="hooks"')]
    assert re.findall(r'title="(wevt_z\d+)"', timeline) == [
        "wevt_z00000000000000000251", "wevt_z00000000000000000252", "wevt_z00000000000000000253",
        "wevt_z00000000000000000254", "wevt_z00000000000000000255", "wevt_z00000000000000000256",
        "wevt_z00000000000000000257",
    ]
    assert "first events" in timeline and "next events" not in timeline


def test_it_offers_no_add_change_or_delete_of_event_sourced_state(admin_client, world):
    pk = Run.objects.get(cell__name="wrun_A").pk
    assert admin_client.get(f"{RUNS}add/").status_code == 403
    assert admin_client.get(f"{RUNS}{pk}/delete/").status_code == 403
    response = admin_client.post(f"{RUNS}{pk}/change/", {"status": "completed"})
    assert response.status_code == 403
    assert Run.objects.get(pk=pk).status == "running"
    html = admin_client.get(RUNS).content.decode()
    assert "delete_selected" not in html
    assert Step.objects.count() == 1


@pytest.mark.parametrize("page", ["{pk}/event/%00/", "{pk}/event/a%00b/", "{pk}/step/?id=%00",
                                  "{pk}/change/?events_after=%00", "by-id/wrun_%00/"])
def test_ids_no_text_column_can_hold_are_not_found(admin_client, world, page):
    """A U+0000 in an event, step or run id, or in the timeline cursor: 404, never PostgreSQL's DataError."""
    pk = Run.objects.get(cell__name="wrun_C").pk
    response = admin_client.get(RUNS + page.format(pk=pk))
    assert response.status_code == 404, (response.status_code, response.content[:300])
