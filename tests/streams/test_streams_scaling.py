"""``getChunks`` cost follows its ``limit``, not the stream length (docs/protocol.md §8.2).

No timing assertions here: the test checks the query plan of the chunk query
``getChunks`` runs (``StreamManager.chunk_page_query``) — an index range scan on
``(stream, index)`` that reads only the requested page, with no sort — on a
100,000-chunk stream. Timings are measured by a separate benchmark script.
"""
import json

import pytest
from django.db import connection

from cells.models import Stream

pytestmark = pytest.mark.django_db

CHUNKS = 100_000
PAGE = 32


def fill(stream_id, analyze):
    """Insert chunks 1..CHUNKS-1 of ``stream_id`` directly (chunk i holds i as 4 bytes)."""
    with connection.cursor() as cur:
        if connection.vendor == "postgresql":
            cur.execute(
                'INSERT INTO cells_streamchunk (stream_id, "index", data) '
                "SELECT %s, g, int4send(g) FROM generate_series(1, %s) g",
                [stream_id, CHUNKS - 1],
            )
            if analyze:
                cur.execute("ANALYZE cells_streamchunk")
        else:
            cur.executemany(
                'INSERT INTO cells_streamchunk (stream_id, "index", data) VALUES (%s, %s, %s)',
                [(stream_id, i, i.to_bytes(4, "big")) for i in range(1, CHUNKS)],
            )
            if analyze:
                cur.execute("ANALYZE")
    Stream.objects.filter(pk=stream_id).update(count=CHUNKS)


def plan_nodes(plan):
    yield plan
    for child in plan.get("Plans", []):
        yield from plan_nodes(child)


@pytest.mark.parametrize("analyze", [True, False], ids=["fresh-statistics", "no-statistics"])
@pytest.mark.parametrize("start", [0, CHUNKS // 2, CHUNKS - PAGE])
def test_it_reads_any_page_of_a_long_stream_with_one_bounded_index_range_scan(rpc, start, analyze):
    rpc.ok("streams", "stream:long", "writeChunk", (0).to_bytes(4, "big"))
    stream_id = Stream.objects.get(name="stream:long").pk
    fill(stream_id, analyze)

    page = rpc.ok("streams", "stream:long", "getChunks", {"startIndex": start, "limit": PAGE})
    assert page["tailIndex"] == CHUNKS - 1
    assert page["chunks"] == [i.to_bytes(4, "big") for i in range(start, start + PAGE)]

    sql, params = Stream.objects.chunk_page_query(stream_id, start, CHUNKS, PAGE)
    with connection.cursor() as cur:
        if connection.vendor == "postgresql":
            cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
            raw = cur.fetchone()[0]
            plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
            nodes = list(plan_nodes(plan))
            assert not {n["Node Type"] for n in nodes} & {"Seq Scan", "Parallel Seq Scan"}, nodes
            assert {n.get("Index Name") for n in nodes} & {"cells_streamchunk_stream_index_uniq"}, nodes
            # no step of the plan touches more rows than the page holds
            assert max(n["Actual Rows"] for n in nodes) == PAGE, nodes
        else:
            cur.execute("EXPLAIN QUERY PLAN " + sql, params)
            details = " / ".join(str(row[-1]) for row in cur.fetchall())
            assert "SEARCH" in details and "INDEX" in details, details
            assert "TEMP B-TREE" not in details, details
