"""Console v2 (issue 15): waterfall, run-list counts / failure reason / search / jump, stream viewer, live fragments.

Through Django's test client on real data (runs played through the RPC route
under a virtual clock, or bulk-seeded for the query-count checks); the real
waitress server is exercised in ``test_console_views_server.py``.
"""
from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from cells import admin_runlist, admin_streams
from cells.admin_waterfall import axis_ticks, build_waterfall
from cells.models import Run, RunCellState
from worldcell import display

from .console_story import play_run
from .support import RUNS, ClientSequence, seed_runs

pytestmark = pytest.mark.django_db


def _pk(run_id: str) -> int:
    return Run.objects.get(cell__name=run_id).pk


# --------------------------------------------------------------------------- waterfall


def test_the_axis_picks_1_2_5_ticks_and_labels_them_in_ms_s_min():
    assert [label for _, label in axis_ticks(1000)] == ["0", "200 ms", "400 ms", "600 ms", "800 ms", "1 s"]
    assert [label for _, label in axis_ticks(60_000)] == ["0", "10 s", "20 s", "30 s", "40 s", "50 s", "1 min"]
    assert [label for _, label in axis_ticks(3_600_000)][:3] == ["0", "10 min", "20 min"]
    assert [label for _, label in axis_ticks(4_000)][:4] == ["0", "500 ms", "1 s", "1.5 s"]
    assert len(axis_ticks(7 * 86_400_000)) <= 9 and axis_ticks(7 * 86_400_000)[-1][1].endswith("d")


def test_it_lays_out_steps_waits_and_hooks_with_retry_marks():
    chart = build_waterfall(
        origin_ms=1000, end_ms=5000,
        steps=[
            {"step_id": "s1", "step_name": "charge", "status": "completed", "attempt": 2,
             "created_ms": 1000, "started_ms": 1100, "completed_ms": 2100},
            {"step_id": "s2", "step_name": "ship", "status": "running", "attempt": 1,
             "created_ms": 2200, "started_ms": 2300, "completed_ms": None},
        ],
        events=[("step_started", "s1", 1100), ("step_retrying", "s1", 1400), ("step_started", "s1", 1600),
                ("wait_created", "w1", 2100), ("wait_completed", "w1", 3100),
                ("hook_created", "h1", 1200), ("hook_received", "h1", 4000)],
    )
    by_label = {lane.label: lane for lane in chart.lanes}
    assert [lane.kind for lane in chart.lanes] == ["step", "hook", "wait", "step"]  # by start
    charge = by_label["charge"]
    assert (charge.bar.left_pct, charge.bar.width_pct) == (2.5, 25.0)  # 100..1100 ms of 4000
    assert [(p, kind) for p, kind, _ in charge.bar.mark_pcts] == [(15.0, "retry"), (10.0, "fail")]
    ship = by_label["ship"]
    assert ship.bar.open and ship.bar.left_pct + ship.bar.width_pct == 100.0  # runs to "now"
    wait = by_label["sleep w1"]
    assert (wait.bar.left_pct, wait.bar.width_pct, wait.bar.open) == (27.5, 25.0, False)
    hook = by_label["hook h1"]
    assert hook.bar.open and [k for _, k, _ in hook.bar.mark_pcts] == ["recv"]
    assert chart.span_ms == 4000 and chart.ticks[-1] == (100.0, "4 s")


def test_the_run_page_draws_the_waterfall_of_a_53_step_run(admin_client, rpc, vclock):
    seq = ClientSequence(rpc)
    story = play_run(seq, vclock.advance, "wrun_story53", steps=53)
    html = admin_client.get(f"{RUNS}{_pk('wrun_story53')}/change/").content.decode()
    chart = html[html.index('id="waterfall"'):html.index('id="steps"')]
    rows = re.findall(r'<div class="wc-wf-row wc-wf-(\w+)">', chart)
    assert rows.count("step") == 53 and rows.count("wait") == len(story["waits"]) == 5 and rows.count("hook") == 1
    assert chart.count("wc-wf-m-retry") == len(story["retried"]) + 1  # + the legend
    assert chart.count("wc-wf-m-recv") == 2 + 1
    assert "×2" in chart and "span " in chart
    assert re.search(r'wc-wf-tick" style="left: [\d.]+%">\d+ s<', chart)  # a ~20 s run: ticks in s


def test_a_failed_run_shows_its_failure_reason_first_line_in_the_list(admin_client, rpc, vclock):
    seq = ClientSequence(rpc)
    play_run(seq, vclock.advance, "wrun_failing", steps=4, outcome="failed")
    play_run(seq, vclock.advance, "wrun_fine", steps=2)
    html = admin_client.get(RUNS).content.decode()
    cells = re.findall(r'<td class="field-failure">(.*?)</td>', html)
    assert len(cells) == 2
    assert any(">card declined</span>" in c for c in cells) and "pay.ts" not in "".join(cells)
    assert "-" in cells  # no error: the empty-value dash


# --------------------------------------------------------------------------- counts, search, jump


def test_the_status_filter_shows_counts_exact_up_to_the_cap(admin_client, rpc, vclock, monkeypatch):
    seq = ClientSequence(rpc)
    for i in range(4):
        play_run(seq, vclock.advance, f"wrun_c{i}", steps=1)
    play_run(seq, vclock.advance, "wrun_cf", steps=1, outcome="failed")
    html = admin_client.get(RUNS).content.decode()
    assert "By status (counts of all runs)" in html  # not of the search or the other filters
    assert re.search(r'completed <span class="wc-count" title="exact count">4</span>', html)
    assert re.search(r'failed <span class="wc-count" title="exact count">1</span>', html)
    assert re.search(r'pending <span class="wc-count" title="exact count">0</span>', html)
    monkeypatch.setattr(admin_runlist, "COUNT_CAP", 3)
    html = admin_client.get(RUNS).content.decode()
    label = re.search(r'completed <span class="wc-count" title="([^"]+)">([^<]+)</span>', html)
    assert label.group(1).startswith("more than 3")
    assert label.group(2) == ("3+" if connection.vendor != "postgresql" else label.group(2))
    assert connection.vendor != "postgresql" or label.group(2).startswith(("≈", "3+"))


def _listed(client, **params) -> list[str]:
    html = client.get(RUNS, params).content.decode()
    return re.findall(r'<th class="field-run_id"><a href="[^"]+">([^<]+)</a>', html)


def test_search_finds_substrings_and_prefixes_case_insensitively(admin_client):
    seed_runs(30, 1, workflows=("wf-Checkout", "wf-refund"), hooks=1)
    assert _listed(admin_client, q="seed00002")[::-1][:3] == ["wrun_seed000020", "wrun_seed000021", "wrun_seed000022"]
    assert len(_listed(admin_client, q="wrun_seed00001")) == 10  # a prefix
    assert len(_listed(admin_client, q="checkout")) == 15  # a substring of the workflow name, any case
    assert len(_listed(admin_client, q="dpl_2")) == 10  # deployment
    assert _listed(admin_client, q="tok-7-0") == ["wrun_seed000007"]  # hook token, exact
    assert _listed(admin_client, q="nothing-like-this") == []
    assert admin_client.get(RUNS, {"q": "bad\x00term"}).status_code == 200


@pytest.mark.postgres_only
def test_the_search_indexes_are_trigram_gin_and_serve_the_substring_search():
    with connection.cursor() as cur:
        cur.execute("SELECT indexname, indexdef FROM pg_indexes WHERE indexname LIKE '%%_trgm'")
        defs = dict(cur.fetchall())
        assert set(defs) == {"cells_cell_name_trgm", "cells_run_workflow_trgm", "cells_run_deployment_trgm"}
        assert all("gin" in d and "gin_trgm_ops" in d and "upper(" in d for d in defs.values()), defs
        cur.execute("SET LOCAL enable_seqscan = off")
        plans = []
        for qs in (RunCellState.objects.filter(name__icontains="seed0042"),
                   Run.objects.filter(workflow_name__icontains="heck") | Run.objects.filter(deployment_id__icontains="pl_")):
            sql, params = qs.values("pk").query.sql_with_params()
            cur.execute("EXPLAIN " + sql, params)
            plans.append("\n".join(r[0] for r in cur.fetchall()))
        plan = "\n".join(plans)
    assert "cells_cell_name_trgm" in plan and "cells_run_workflow_trgm" in plan and "cells_run_deployment_trgm" in plan, plan


def test_the_run_id_jump_opens_a_unique_run_else_lists_the_matches(admin_client):
    seed_runs(12, 0, hooks=0)
    one = admin_client.get(f"{RUNS}jump/", {"prefix": "wrun_seed000011"})
    assert one.status_code == 302 and one["Location"] == f"{RUNS}{_pk('wrun_seed000011')}/change/"
    many = admin_client.get(f"{RUNS}jump/", {"prefix": "wrun_seed00001"})
    assert many.status_code == 302 and many["Location"] == f"{RUNS}?q=wrun_seed00001"
    none = admin_client.get(f"{RUNS}jump/", {"prefix": "wrun_zzz"}, follow=True)
    assert "No run id starts with" in none.content.decode()
    assert admin_client.get(f"{RUNS}jump/", {"prefix": "x\x00"}).status_code == 302


# --------------------------------------------------------------------------- bounded queries


def _queries(client, url, **params) -> int:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url, params)
    assert response.status_code == 200, url
    return len(ctx.captured_queries)


def test_the_run_list_and_search_cost_the_same_queries_at_10_and_500_runs(admin_client):
    seed_runs(10, 1, hooks=1)
    small = [_queries(admin_client, RUNS), _queries(admin_client, RUNS, q="seed"), _queries(admin_client, RUNS, _fragment="results")]
    seed_runs(490, 1, hooks=1, first=10)
    assert Run.objects.count() == 500
    big = [_queries(admin_client, RUNS), _queries(admin_client, RUNS, q="seed"), _queries(admin_client, RUNS, _fragment="results")]
    assert small == big, (small, big)


def test_the_run_page_and_its_fragment_cost_the_same_queries_at_5_and_200_steps(admin_client):
    small_run = seed_runs(2, 5, hooks=2)[0]
    counts_small = [_queries(admin_client, f"{RUNS}{small_run.pk}/change/"), _queries(admin_client, f"{RUNS}{small_run.pk}/live/")]
    RunCellState.objects.filter(name__startswith="wrun_seed").delete()
    big_run = seed_runs(1, 200, hooks=2)[0]
    counts_big = [_queries(admin_client, f"{RUNS}{big_run.pk}/change/"), _queries(admin_client, f"{RUNS}{big_run.pk}/live/")]
    assert counts_small == counts_big, (counts_small, counts_big)
    html = admin_client.get(f"{RUNS}{big_run.pk}/change/").content.decode()
    assert html.count('<div class="wc-wf-row wc-wf-step">') == 200


# --------------------------------------------------------------------------- live fragments


def test_the_live_fragments_are_the_results_table_and_the_run_sections(admin_client, rpc, vclock):
    seq = ClientSequence(rpc)
    play_run(seq, vclock.advance, "wrun_live", steps=3, outcome="running")
    page = admin_client.get(RUNS, {"status__exact": "running"}).content.decode()
    url = re.search(r'<div id="wc-results" hx-get="([^"]+)" hx-trigger="every 5s \[wcLiveOn\(.runs., this\)\]"', page)
    assert url, page[:2000]
    fragment_url = url.group(1).replace("&amp;", "&")
    assert "status__exact=running" in fragment_url and "_fragment=results" in fragment_url
    fragment = admin_client.get(fragment_url).content.decode()
    assert fragment.lstrip().startswith("<div id=\"wc-results\"") and "<html" not in fragment
    assert "wrun_live" in fragment and "updated" in fragment
    assert "htmx-2.0.4.min.js" in page and "console-live.js" in page and "times in UTC" in page

    run_page = admin_client.get(f"{RUNS}{_pk('wrun_live')}/change/").content.decode()
    live_url = re.search(r'<div id="wc-run-live" hx-get="([^"]+)"', run_page).group(1)
    assert live_url == f"{RUNS}{_pk('wrun_live')}/live/"
    vclock.advance(1000)
    seq.apply("wrun_live", "step_created", "step_late", stepName="late-step")
    live = admin_client.get(live_url).content.decode()
    assert live.lstrip().startswith('<div id="wc-run-live"') and "<html" not in live
    assert "late-step" in live and 'id="waterfall"' in live and "running" in live


# --------------------------------------------------------------------------- streams


def _stream_run(seq, vclock, chunks: list[bytes]) -> tuple[int, str]:
    play_run(seq, vclock.advance, "wrun_streamy", steps=1)
    for c in chunks:
        seq.rpc.ok("streams", "run-streams:wrun_streamy", "registerStream", "strm_out")
        seq.rpc.ok("streams", "stream:strm_out", "writeChunk", c)
    return _pk("wrun_streamy"), "strm_out"


def test_the_stream_viewer_pages_through_every_chunk_as_text_json_or_hex(admin_client, rpc, vclock, monkeypatch):
    monkeypatch.setattr(admin_streams, "CHUNKS_PER_PAGE", 20)
    chunks = [f'{{"n": {i}, "msg": "chunk {i}"}}\n'.encode() for i in range(45)]
    pk, name = _stream_run(ClientSequence(rpc), vclock, chunks)
    url = f"{RUNS}{pk}/stream/"
    run_page = admin_client.get(f"{RUNS}{pk}/change/").content.decode()
    assert f'{url}?name={name}' in run_page and f"{RUNS}{pk}/stream/download/?name={name}" in run_page
    first = admin_client.get(url, {"name": name}).content.decode()
    assert re.findall(r'<tr id="chunk-(\d+)">', first) == [str(i) for i in range(20)]
    assert "chunk 0" in first and "45 chunks" in first
    last = admin_client.get(url, {"name": name, "from": 40}).content.decode()
    assert re.findall(r'<tr id="chunk-(\d+)">', last) == [str(i) for i in range(40, 45)]
    as_json = admin_client.get(url, {"name": name, "from": 20, "as": "json"}).content.decode()
    assert '<span class="wc-key">' in as_json and 'class="wc-on" aria-current="true">json<' in as_json
    as_hex = admin_client.get(url, {"name": name, "as": "hex"}).content.decode()
    assert "00000000  7b 22 6e 22" in as_hex
    assert admin_client.get(url, {"name": "strm_other"}).status_code == 404
    assert admin_client.get(url, {"name": name, "from": "x"}).status_code == 200


def test_the_stream_download_is_every_chunk_in_order_streamed(admin_client, rpc, vclock, monkeypatch):
    monkeypatch.setattr(admin_streams, "DOWNLOAD_BATCH", 7)
    chunks = [bytes([i % 256]) * (i + 1) for i in range(50)]
    pk, name = _stream_run(ClientSequence(rpc), vclock, chunks)
    with CaptureQueriesContext(connection) as ctx:
        response = admin_client.get(f"{RUNS}{pk}/stream/download/", {"name": name})
        body = b"".join(response.streaming_content)
    assert response.status_code == 200 and response.streaming
    assert body == b"".join(chunks)
    assert response["Content-Disposition"] == 'attachment; filename="strm_out.bin"'
    batches = [q for q in ctx.captured_queries if "cells_streamchunk" in q["sql"]]
    assert len(batches) == 8  # ceil(50 / 7) range reads, never one read of everything
    assert admin_client.get(f"{RUNS}{pk}/stream/download/", {"name": "nope"}).status_code == 404


def test_non_bytes_chunks_download_as_their_decoded_text():
    assert admin_streams.chunk_bytes(None, '"héllo"'.encode().decode()) == "héllo".encode()
    assert admin_streams.chunk_bytes(None, '{"__type":"Uint8Array","data":"AAE="}') == b"\x00\x01"
    assert admin_streams.chunk_bytes(None, '{"a":[1,2]}') == b'{"a": [1, 2]}'
    assert admin_streams.chunk_bytes(b"raw", None) == b"raw"


# --------------------------------------------------------------------------- payload previews


def test_short_uint8arrays_show_whole_and_json_bytes_decode_as_json():
    html = str(display.render_value(b'{"total": 42.5, "items": [1, 2]}', inline=True))
    assert "Uint8Array(32 bytes)" in html and " json " in html and '<span class="wc-key">' in html
    assert "42.5" in html and "&quot;total&quot;" in html
    text = str(display.render_value("a plain sentence of more than twenty-four bytes".encode(), inline=True))
    assert " utf-8 " in text and "twenty-four bytes&quot;" in text and "…" not in text
    big = str(display.render_value(b"x" * 5000, inline=True))
    assert "Uint8Array(5,000 bytes)" in big and "…" in big
    assert " hex " in str(display.render_value(bytes(range(200, 216))))
