"""``index.list`` — the P3 key-ordered page (docs/protocol.md §4.0 P3, §4.3; acceptance §11.5 items 29–33)."""
import pytest

from cells.index import prefix_upper_bound

pytestmark = pytest.mark.django_db


def put_keys(rpc, *keys, cell="index"):
    for key in keys:
        rpc.ok("index", cell, "put", key, "x")


def names(page):
    return [k["name"] for k in page["keys"]]


def listing(rpc, options, cell="index"):
    return rpc.ok("index", cell, "list", options)


def walk(rpc, options):
    """Follow cursors until the listing is complete; returns every key seen, in order."""
    seen = []
    options = dict(options)
    while True:
        page = listing(rpc, options)
        seen += names(page)
        if page["list_complete"]:
            assert "cursor" not in page
            return seen
        assert page["cursor"] == names(page)[-1]
        options["cursor"] = page["cursor"]


def test_it_lists_a_prefix_in_lexicographic_order(rpc):
    put_keys(rpc, "run:b:1", "hook:t1", "run:a:2", "run:a:1")
    page = listing(rpc, {"prefix": "run:"})
    assert page == {"keys": [{"name": "run:a:1"}, {"name": "run:a:2"}, {"name": "run:b:1"}], "list_complete": True}


def test_it_paginates_with_the_last_returned_key_as_cursor(rpc):
    put_keys(rpc, *(f"run:wf:{i}" for i in range(1, 6)))
    page1 = listing(rpc, {"prefix": "run:", "limit": 2})
    assert page1 == {"keys": [{"name": "run:wf:1"}, {"name": "run:wf:2"}], "list_complete": False, "cursor": "run:wf:2"}
    page2 = listing(rpc, {"prefix": "run:", "limit": 2, "cursor": page1["cursor"]})
    assert names(page2) == ["run:wf:3", "run:wf:4"]
    assert page2["list_complete"] is False
    page3 = listing(rpc, {"prefix": "run:", "limit": 2, "cursor": page2["cursor"]})
    assert page3 == {"keys": [{"name": "run:wf:5"}], "list_complete": True}


def test_it_pages_fifteen_runs_of_one_workflow_by_ten(rpc):
    put_keys(rpc, *(f"run:paginated-workflow:{1767323045678 + i:013d}:wrun_{i:02d}" for i in range(15)))
    put_keys(rpc, "run:paginated-workflow2:0000000000001:wrun_x")
    page = listing(rpc, {"prefix": "run:paginated-workflow:", "limit": 10})
    assert len(page["keys"]) == 10 and page["list_complete"] is False
    rest = listing(rpc, {"prefix": "run:paginated-workflow:", "limit": 10, "cursor": page["cursor"]})
    assert len(rest["keys"]) == 5 and rest["list_complete"] is True


def test_it_reports_complete_without_cursor_when_a_page_ends_at_the_last_key(rpc):
    put_keys(rpc, "run:wf:1", "run:wf:2")
    assert listing(rpc, {"prefix": "run:", "limit": 2}) == {
        "keys": [{"name": "run:wf:1"}, {"name": "run:wf:2"}],
        "list_complete": True,
    }


def test_it_pages_in_reverse_below_the_cursor(rpc):
    put_keys(rpc, *(f"run:wf:{i}" for i in range(1, 6)))
    page1 = listing(rpc, {"prefix": "run:", "limit": 2, "reverse": True})
    assert page1 == {"keys": [{"name": "run:wf:5"}, {"name": "run:wf:4"}], "list_complete": False, "cursor": "run:wf:4"}
    page2 = listing(rpc, {"prefix": "run:", "limit": 2, "reverse": True, "cursor": "run:wf:4"})
    assert page2 == {"keys": [{"name": "run:wf:3"}, {"name": "run:wf:2"}], "list_complete": False, "cursor": "run:wf:2"}
    page3 = listing(rpc, {"prefix": "run:", "limit": 2, "reverse": True, "cursor": "run:wf:2"})
    assert page3 == {"keys": [{"name": "run:wf:1"}], "list_complete": True}


def test_it_answers_limit_zero_with_an_empty_incomplete_page_and_no_cursor(rpc):
    put_keys(rpc, "run:wf:1")
    assert listing(rpc, {"prefix": "run:", "limit": 0}) == {"keys": [], "list_complete": False}
    assert listing(rpc, {"prefix": "nothing:", "limit": 0}) == {"keys": [], "list_complete": True}


def test_it_lists_every_key_of_the_cell_without_a_prefix(rpc):
    put_keys(rpc, "b", "a", "c", "d")
    assert listing(rpc, {"limit": 3}) == {
        "keys": [{"name": "a"}, {"name": "b"}, {"name": "c"}],
        "list_complete": False,
        "cursor": "c",
    }
    assert names(listing(rpc, None)) == ["a", "b", "c", "d"]
    assert names(rpc.ok("index", "index", "list")) == ["a", "b", "c", "d"]


def test_it_lists_an_empty_cell_as_complete(rpc):
    assert listing(rpc, None) == {"keys": [], "list_complete": True}
    assert listing(rpc, {"reverse": True, "limit": 1}) == {"keys": [], "list_complete": True}


def test_it_treats_null_options_as_absent(rpc):
    put_keys(rpc, "a", "b")
    page = listing(rpc, {"prefix": None, "cursor": None, "limit": None, "reverse": None})
    assert page == {"keys": [{"name": "a"}, {"name": "b"}], "list_complete": True}


def test_it_follows_the_cursor_outside_the_prefix(rpc):
    put_keys(rpc, "run:a", "run:b", "runall:x")
    assert names(listing(rpc, {"prefix": "run:", "cursor": "ru"})) == ["run:a", "run:b"]
    assert names(listing(rpc, {"prefix": "run:", "cursor": "zzz"})) == []
    assert names(listing(rpc, {"prefix": "run:", "cursor": "zzz", "reverse": True})) == ["run:b", "run:a"]


def test_it_treats_an_empty_cursor_as_the_lowest_key(rpc):
    put_keys(rpc, "a", "b")
    assert names(listing(rpc, {"cursor": ""})) == ["a", "b"]
    assert listing(rpc, {"cursor": "", "reverse": True}) == {"keys": [], "list_complete": True}


def test_it_includes_a_key_equal_to_the_prefix(rpc):
    put_keys(rpc, "run", "run:", "run:a", "run;", "ruo", "ru")
    assert names(listing(rpc, {"prefix": "run:"})) == ["run:", "run:a"]
    assert names(listing(rpc, {"prefix": "run"})) == ["run", "run:", "run:a", "run;"]


def test_it_pages_one_key_at_a_time_across_the_prefix_boundary(rpc):
    put_keys(rpc, "a:", "a:1", "a:2", "a;", "a:\x7f", "b")
    assert walk(rpc, {"prefix": "a:", "limit": 1}) == ["a:", "a:1", "a:2", "a:\x7f"]
    assert walk(rpc, {"prefix": "a:", "limit": 1, "reverse": True}) == ["a:\x7f", "a:2", "a:1", "a:"]


def test_it_pages_of_exactly_limit_end_complete(rpc):
    put_keys(rpc, *(f"p:{i:02d}" for i in range(6)), "q")
    page1 = listing(rpc, {"prefix": "p:", "limit": 3})
    assert page1["list_complete"] is False
    page2 = listing(rpc, {"prefix": "p:", "limit": 3, "cursor": page1["cursor"]})
    assert names(page2) == ["p:03", "p:04", "p:05"]
    assert page2["list_complete"] is True
    assert "cursor" not in page2


def test_it_keeps_keys_with_characters_above_z_inside_the_prefix(rpc):
    keys = ["k:z", "k:{", "k:~", "k:\x7f", "k:\u00e9", "k:\u07ff", "k:\uffff", "k:\U0001f600", "k:\U0010ffff"]
    put_keys(rpc, "k;", "l", *keys)
    assert walk(rpc, {"prefix": "k:", "limit": 2}) == keys
    assert walk(rpc, {"prefix": "k:", "limit": 2, "reverse": True}) == keys[::-1]


def test_it_orders_keys_by_code_point_like_utf8_bytes(rpc):
    # U+FFFF sorts before an astral character by code point (and UTF-8 bytes),
    # although UTF-16 code units would put the astral surrogate pair first (§12 A3).
    keys = ["\u0041", "\u00e9", "\ue000", "\uffff", "\U00010000", "\U0001f600", "\U0010ffff"]
    put_keys(rpc, *reversed(keys))
    assert names(listing(rpc, None)) == keys
    assert sorted(keys, key=lambda k: k.encode("utf-8")) == keys


@pytest.mark.parametrize(
    "prefix,inside,outside",
    [
        ("50%", ["50%", "50% off", "50%%"], ["50", "500", "50x", "5%"]),
        ("a_b", ["a_b", "a_bc"], ["aXb", "a.b", "ab"]),
        ("back\\slash", ["back\\slash", "back\\slash\\x"], ["backslash", "back\\\\slash"]),
        ("%", ["%", "%a"], ["a", ""]),
        ("_", ["_", "__"], ["a", "^"]),
        ("ключ:", ["ключ:1", "ключ:я"], ["ключ", "ключ;", "ключа"]),
        ("\U0001f600", ["\U0001f600", "\U0001f600x"], ["\U0001f601", "\U0001f5ff", "\uffff"]),
        ("\U0010ffff", ["\U0010ffff", "\U0010ffff\U0010ffff"], ["\U0010fffe", "\uffff"]),
        ("a\U0010ffff", ["a\U0010ffff", "a\U0010ffffz"], ["a\U0010fffe", "b", "a"]),
        ("'; DROP TABLE x; --", ["'; DROP TABLE x; --1"], ["'"]),
    ],
)
def test_it_matches_prefixes_exactly_for_any_character(rpc, prefix, inside, outside):
    put_keys(rpc, *inside, *outside)
    assert names(listing(rpc, {"prefix": prefix})) == sorted(inside, key=lambda k: k.encode())
    assert walk(rpc, {"prefix": prefix, "limit": 1, "reverse": True}) == sorted(
        inside, key=lambda k: k.encode(), reverse=True
    )


def test_it_scopes_listing_to_its_cell(rpc):
    put_keys(rpc, "run:1", "run:2")
    put_keys(rpc, "run:3", cell="other")
    assert names(listing(rpc, {"prefix": "run:"})) == ["run:1", "run:2"]
    assert names(listing(rpc, {"prefix": "run:"}, cell="other")) == ["run:3"]


def test_it_lists_hook_claims_written_by_reservation(rpc):
    rpc.ok("index", "index", "reserveHookToken", "tok", {"runId": "wrun_A", "hookId": "h1"})
    assert names(listing(rpc, {"prefix": "hook"})) == ["hookclaim:tok"]


@pytest.mark.parametrize(
    "options,field",
    [
        ("run:", "options"),
        ([1], "options"),
        ({"prefix": 5}, "options.prefix"),
        ({"cursor": 5}, "options.cursor"),
        ({"limit": -1}, "options.limit"),
        ({"limit": 1.5}, "options.limit"),
        ({"limit": "10"}, "options.limit"),
        ({"limit": True}, "options.limit"),
        ({"reverse": "yes"}, "options.reverse"),
        ({"prefix": "a\u0000"}, "options.prefix"),
    ],
)
def test_it_rejects_mistyped_options_with_400(rpc, options, field):
    status, body = rpc("index", "index", "list", options)
    assert status == 400
    assert body["error"]["name"] == "ValidationError"
    assert body["error"]["message"].startswith(field + ":")


def test_it_clamps_a_huge_limit(rpc):
    put_keys(rpc, "a")
    assert listing(rpc, {"limit": 10**30}) == {"keys": [{"name": "a"}], "list_complete": True}


@pytest.mark.parametrize(
    "prefix,bound",
    [("", None), ("run:", "run;"), ("a\U0010ffff", "b"), ("\U0010ffff", None), ("\ud7ff", "\ue000"), ("z", "{")],
)
def test_it_computes_the_smallest_string_above_a_prefix(prefix, bound):
    assert prefix_upper_bound(prefix) == bound


@pytest.mark.postgres_only
@pytest.mark.parametrize("reverse", [False, True])
def test_it_lists_by_an_index_range_scan_without_sorting(rpc, reverse):
    import json

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO cells_indexentry (tenant, cell, key, value) "
            "SELECT 'default', 'index', 'run:wf:' || lpad(g::text, 6, '0'), '\"x\"' FROM generate_series(1, 20000) g "
            "UNION ALL SELECT 'default', 'index', 'runall:' || lpad(g::text, 6, '0'), '\"x\"' "
            "FROM generate_series(1, 20000) g "
            # the same keys in another tenant: the scan must not read them
            "UNION ALL SELECT 'other', 'index', 'run:wf:' || lpad(g::text, 6, '0'), '\"y\"' FROM generate_series(1, 20000) g"
        )
        cur.execute("ANALYZE cells_indexentry")
    with CaptureQueriesContext(connection) as ctx:
        page = listing(rpc, {"prefix": "run:", "limit": 5, "reverse": reverse, "cursor": "run:wf:010000"})
    expected = [f"run:wf:{i:06d}" for i in (range(9995, 10000)[::-1] if reverse else range(10001, 10006))]
    assert names(page) == expected
    (sql,) = [q["sql"] for q in ctx.captured_queries if "cells_indexentry" in q["sql"]]
    with connection.cursor() as cur:
        cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql)
        raw = cur.fetchone()[0]
    plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
    nodes = [plan, *plan.get("Plans", [])]
    assert {n["Node Type"] for n in nodes} <= {"Limit", "Index Scan", "Index Only Scan"}, nodes
    scan = nodes[-1]
    assert scan["Index Name"] == "cells_indexentry_tenant_key_uniq"
    assert scan["Actual Rows"] == 6  # limit + 1 peek
