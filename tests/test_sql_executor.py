"""The one SQL executor (worldcell.sql): one-trip scripts as prepared statements.

The queue's one-trip scripts (``BEGIN; …; COMMIT``) travel as ``EXECUTE``s
of session-level prepared statements on PostgreSQL (docs/benchmarks.md
"Prepared queue scripts"); these tests check the splitting, the parameter
hand-out, the recovery when the prepared statements vanish, the per-connection
cap, and that a failing statement commits nothing.
"""
from __future__ import annotations

import pytest
from django.db import connection

from worldcell import sql as executor

pytestmark = pytest.mark.django_db(transaction=True)

TABLE = "wc_executor_probe"


@pytest.fixture
def probe_table():
    with connection.cursor() as cur:
        cur.execute(f'CREATE TABLE "{TABLE}" ("k" TEXT PRIMARY KEY, "v" BIGINT NOT NULL)')
    yield
    with connection.cursor() as cur:
        cur.execute(f'DROP TABLE "{TABLE}"')


def _script(*statements: str) -> str:
    return "; ".join(statements)


UPSERT = (f'INSERT INTO "{TABLE}" ("k", "v") VALUES (%s, %s) '
          'ON CONFLICT ("k") DO UPDATE SET "v" = EXCLUDED."v" RETURNING "v"')
COUNT = f'SELECT COUNT(*), COALESCE(SUM("v"), 0) FROM "{TABLE}" WHERE "v" >= %s'
SCRIPT = _script("BEGIN", "SET LOCAL synchronous_commit TO OFF", UPSERT, UPSERT, COUNT, "COMMIT",
                 "SELECT 'after; commit'")


def test_script_statements_split_outside_literals():
    parts = executor.script_statements("BEGIN; SELECT ';' , %s; SELECT 'a''; b', %s, %s ;COMMIT")
    assert parts == (("BEGIN", 0), ("SELECT ';' , %s", 1), ("SELECT 'a''; b', %s, %s", 2), ("COMMIT", 0))


def test_source_text_maps_an_execute_back_to_its_statement():
    wire = "BEGIN; " + executor.execute_text(UPSERT) + "; " + executor.execute_text(COUNT) + "; COMMIT"
    assert executor.source_text(wire) == f"BEGIN; {UPSERT}; {COUNT}; COMMIT"
    assert executor.execute_text("SET LOCAL synchronous_commit TO OFF") == "SET LOCAL synchronous_commit TO OFF"


@pytest.mark.postgres_only  # one-trip scripts are PostgreSQL's (SQLite runs one statement per call)
def test_a_script_returns_the_rows_of_each_statement_that_has_rows(probe_table):
    db = executor.database()
    results = executor.run_script(db, SCRIPT, ["a", 1, "b", 2, 0])
    assert results == [[(1,)], [(2,)], [(2, 3)], [("after; commit",)]]
    assert executor.run_script(db, SCRIPT, ["a", 5, "c", 7, 5]) == [[(5,)], [(7,)], [(2, 12)], [("after; commit",)]]


@pytest.mark.postgres_only
def test_the_statements_inside_the_transaction_are_prepared_the_rest_sent_as_text(probe_table):
    db = executor.database()
    db.close()  # a fresh connection: far from the per-connection cap whatever ran before
    db.ensure_connection()
    executor.run_script(db, SCRIPT, ["a", 1, "b", 2, 0])
    with connection.cursor() as cur:
        cur.execute("SELECT statement FROM pg_prepared_statements WHERE starts_with(name, 'wc_run_')")
        prepared = {row[0] for row in cur.fetchall()}
    assert any(TABLE in text and text.lstrip().startswith("PREPARE") and "INSERT" in text for text in prepared)
    assert any("COUNT(*)" in text for text in prepared)
    assert not any("after; commit" in text for text in prepared)


@pytest.mark.postgres_only
def test_a_script_whose_prepared_statements_vanished_runs_once_and_fully(probe_table):
    db = executor.database()
    executor.run_script(db, SCRIPT, ["a", 1, "b", 2, 0])
    with connection.cursor() as cur:
        cur.execute("DEALLOCATE ALL")  # what a pooler's DISCARD ALL does
    assert executor.run_script(db, SCRIPT, ["a", 10, "c", 20, 0]) == [[(10,)], [(20,)], [(3, 32)], [("after; commit",)]]
    assert db.connection.info.transaction_status == 0  # IDLE: nothing left open


@pytest.mark.postgres_only
def test_a_failing_statement_commits_nothing_of_the_script(probe_table):
    db = executor.database()
    executor.run_script(db, SCRIPT, ["a", 1, "b", 2, 0])
    bad = _script("BEGIN", UPSERT, f'SELECT 1 / (%s - 1) FROM "{TABLE}"', "COMMIT")
    with pytest.raises(Exception):
        executor.run_script(db, bad, ["a", 99, 1])
    assert db.connection.info.transaction_status == 0
    assert executor.run_script(db, _script("BEGIN", COUNT, "COMMIT"), [0]) == [[(2, 3)]]


@pytest.mark.postgres_only
def test_a_script_with_more_values_than_placeholders_is_refused(probe_table):
    db = executor.database()
    with pytest.raises(ValueError, match="more than the script's placeholders"):
        executor.run_script(db, _script("BEGIN", COUNT, "COMMIT"), [0, 1])


@pytest.mark.postgres_only
def test_past_the_per_connection_cap_statements_go_as_text(probe_table, monkeypatch):
    db = executor.database()
    db.close()  # a fresh connection: no prepared statements yet
    db.ensure_connection()
    monkeypatch.setattr(executor, "PREPARED_PER_CONNECTION", 1)
    assert executor.run_script(db, SCRIPT, ["a", 1, "b", 2, 0]) == [[(1,)], [(2,)], [(2, 3)], [("after; commit",)]]
    with connection.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM pg_prepared_statements WHERE starts_with(name, 'wc_run_')")
        assert cur.fetchone()[0] == 1


@pytest.mark.postgres_only
def test_a_statement_with_many_parameters_goes_as_text_and_still_runs(probe_table):
    """Plans cost server memory by parameter count: large batch shapes are not prepared (worldcell.sql)."""
    db = executor.database()
    db.close()
    db.ensure_connection()
    n = executor.PREPARED_MAX_PARAMS // 2 + 1  # two parameters a row: one more than the limit
    many = (f'INSERT INTO "{TABLE}" ("k", "v") VALUES ' + ", ".join(["(%s, %s)"] * n)
            + ' RETURNING "v"')
    params = [p for i in range(n) for p in (f"k{i}", i)]
    script = _script("BEGIN", many, COUNT, "COMMIT")
    assert executor.run_script(db, script, params + [0]) == [[(i,) for i in range(n)], [(n, sum(range(n)))]]
    with connection.cursor() as cur:
        cur.execute("SELECT statement FROM pg_prepared_statements WHERE starts_with(name, 'wc_run_')")
        prepared = [row[0] for row in cur.fetchall()]
    assert any("COUNT(*)" in text for text in prepared)  # the small one is prepared
    assert not any("INSERT" in text for text in prepared)
