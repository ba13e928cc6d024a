"""The console's pages cost a bounded number of queries, whatever the size of the tables.

200 runs of 50 steps each (plus their events and hooks) are bulk-inserted;
the run list, a run page, searches and the queue pages must stay within a
fixed query budget (no N+1), and no list counts a whole table.
"""
from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from cells.models import Event, Run, RunCellState, Step
from worldcell.admin_site import CappedCountPaginator

from .support import RUNS, seed_runs

pytestmark = pytest.mark.django_db

#: Queries a page may take: session + user, then the page's own reads (measured: run list 11 = 6 + one
#: capped count per status beside the filter; run page 11 = 9 + the waterfall's steps and timing events).
LIST_BUDGET = 13
RUN_PAGE_BUDGET = 14


@pytest.fixture(scope="module")
def many_runs(django_db_setup, django_db_blocker):
    """Seeded once for the module (committed), removed after its last test."""
    with django_db_blocker.unblock():
        runs = seed_runs(200, 50)
        assert Step.objects.count() == 200 * 50
        assert Event.objects.count() == 200 * (2 + 2 * 50 + 2)
    yield runs
    with django_db_blocker.unblock():
        RunCellState.objects.filter(name__startswith="wrun_seed").delete()


def test_it_renders_the_run_list_of_200_runs_with_a_bounded_number_of_queries(
    admin_client, many_runs, django_assert_max_num_queries
):
    with django_assert_max_num_queries(LIST_BUDGET):
        response = admin_client.get(RUNS)
    assert response.status_code == 200
    assert len(re.findall(r'<th class="field-run_id">', response.content.decode())) == 100
    with django_assert_max_num_queries(LIST_BUDGET):
        response = admin_client.get(RUNS, {"p": "2", "status__exact": "running", "workflow_name": "wf-a"})
    assert response.status_code == 200


def test_it_renders_a_run_page_with_50_steps_with_a_bounded_number_of_queries(
    admin_client, many_runs, django_assert_max_num_queries
):
    from django.contrib.contenttypes.models import ContentType

    run = many_runs[123]
    # the content-type cache is filled once per process (by whichever test asks first), not per page
    ContentType.objects.get_for_model(type(run))
    with django_assert_max_num_queries(RUN_PAGE_BUDGET):
        response = admin_client.get(f"{RUNS}{run.pk}/change/")
    assert response.status_code == 200
    html = response.content.decode()
    assert html.count("step/?id=step_") == 50 + 100 + 50  # step rows + step events + waterfall lanes
    assert "104 events" in html and "2 live of 2 created" in html


def test_it_searches_200_runs_with_a_bounded_number_of_queries(admin_client, many_runs, django_assert_max_num_queries):
    for term, expected in (("wrun_seed000042", 1), ("step_0007", 100), ("tok-17-1", 1)):
        with django_assert_max_num_queries(LIST_BUDGET + 3):
            response = admin_client.get(RUNS, {"q": term})
        shown = len(re.findall(r'<th class="field-run_id">', response.content.decode()))
        assert shown == expected, term


def test_it_counts_at_most_the_cap_plus_one_rows(admin_client, many_runs, monkeypatch):
    monkeypatch.setattr(CappedCountPaginator, "count_cap", 150)
    with CaptureQueriesContext(connection) as ctx:
        response = admin_client.get(RUNS)
    html = response.content.decode()
    assert "more than 150 runs" in html
    counts = [q["sql"] for q in ctx.captured_queries if "COUNT(" in q["sql"].upper()]
    # the list's count stops at the cap + 1; the status counts beside the filter at theirs
    assert counts and all("LIMIT 151" in sql or "LIMIT 1001" in sql for sql in counts), counts
    assert sum("LIMIT 151" in sql for sql in counts) == 1 and all("SUBSTR" not in sql.upper() for sql in counts)
    assert admin_client.get(RUNS, {"p": "2"}).status_code == 200  # page 2 of the capped 150
    assert "200 runs" not in html


def test_it_reports_an_exact_count_below_the_cap(admin_client, many_runs):
    html = admin_client.get(RUNS, {"workflow_name": "wf-b"}).content.decode()
    assert "100 runs" in html


def test_it_renders_the_queue_pages_with_a_bounded_number_of_queries(admin_client, db, django_assert_max_num_queries):
    from queueing.models import DeadLetter, Message, QueueCell

    for n in range(8):
        cell = QueueCell.objects.create(name=f"q:{n}", queue_shards=8, pinned_at=1, alarm_at=10)
        Message.objects.bulk_create([
            Message(cell=cell, message_id=f"m{n}-{i}", queue_name="__wkf_step_x", pathname="step", body='"{}"',
                    target_base_url="http://app", enqueued_at=1, due_at=5 + i, updated_at=1)
            for i in range(30)
        ])
        DeadLetter.objects.bulk_create([
            DeadLetter(cell=cell, dlq_key=f"dlq:0000000000009:d{n}-{i}", message_id=f"d{n}-{i}",
                       queue_name="__wkf_step_x", pathname="step", body='"{\\"runId\\":\\"wrun_1\\"}"',
                       target_base_url="http://app", attempt=5, enqueued_at=1, last_error="HTTP 500", failed_at=9)
            for i in range(30)
        ])
    for url in ("/admin/queueing/queuecell/", "/admin/queueing/message/", "/admin/queueing/deadletter/",
                f"/admin/queueing/queuecell/{QueueCell.objects.get(name='q:3').pk}/change/"):
        # the dashboard adds the outcome minutes and the drivers' heartbeats (queueing.console)
        extra = 6 if url == "/admin/queueing/queuecell/" else 4
        with django_assert_max_num_queries(LIST_BUDGET + extra):
            assert admin_client.get(url).status_code == 200, url


def test_it_keeps_big_runs_out_of_the_list_query(admin_client, many_runs):
    Run.objects.filter(pk=many_runs[0].pk).update(output="x" * 1_000_000)
    with CaptureQueriesContext(connection) as ctx:
        admin_client.get(RUNS)
    listing = [q["sql"] for q in ctx.captured_queries if "cells_run" in q["sql"] and "ORDER BY" in q["sql"]]
    assert listing and not any('"cells_run"."output"' in sql for sql in listing)
