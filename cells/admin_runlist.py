"""The run list's finders: status counts beside the filter, the failure reason, search and the run-id jump.

Every piece stays cheap at a million runs (docs/console.md "Run list"):

* ``StatusCountFilter`` — the status filter with a count beside each status:
  an exact count up to ``COUNT_CAP`` (``LIMIT COUNT_CAP + 1`` through the
  status index), above that PostgreSQL's planner estimate (``≈``), on SQLite
  ``1,000+``. One query per status, whatever the table size.
* ``failure_reason`` — the first line of a failed run's ``error.message``,
  read from the first ``FAILURE_HEAD_CHARS`` characters of the column.
* ``search_runs`` — substring and prefix search over run id, workflow name
  and deployment id (pg_trgm GIN indexes on PostgreSQL, migration
  ``0004_console_search``), exact match on step/hook ids (event correlation
  ids) and hook tokens; each kind of match contributes its newest
  ``SEARCH_MATCHES`` runs. SQLite: prefix through the btree indexes, substring
  over the newest ``SQLITE_SCAN_ROWS`` runs only (said in the help text).
* ``runs_with_prefix`` — the run-id prefix jump: the run when one id starts
  with the prefix, else the list.
* ``run_duration_ms`` — a run's duration for the list's column and the run
  page's status (or the time so far while it runs).
"""
from __future__ import annotations

import json

from django.contrib import admin
from django.db import connection
from django.db.models import Q, QuerySet
from django.db.models.functions import Substr
from django.utils.html import format_html

from worldcell import codec, display
from worldcell.keys import storable_text

from .event_machine import TERMINAL_RUN
from .models import Event, Hook, Run, RunCellState

__all__ = [
    "COUNT_CAP",
    "FAILURE_HEAD_CHARS",
    "MAX_TERM_CHARS",
    "SQLITE_SCAN_ROWS",
    "StatusCountFilter",
    "failure_annotation",
    "failure_reason",
    "run_duration_ms",
    "runs_with_prefix",
    "search_runs",
]

#: Exact counts beside the status filter stop here (then an estimate).
COUNT_CAP = 1_000
#: Characters of ``error`` read for the failure-reason column.
FAILURE_HEAD_CHARS = 600
#: SQLite only: substring search looks at this many newest runs at most.
SQLITE_SCAN_ROWS = 50_000
#: Runs each kind of search match contributes at most (newest first).
SEARCH_MATCHES = 2_000
#: Longest search term or jump prefix looked up (longer: nothing matches). SQLite refuses LIKE
#: patterns over 50,000 bytes, and no run id, workflow name or deployment is this long in practice.
MAX_TERM_CHARS = 1_000
#: Shortest term searched as a substring (shorter: prefix only, a trigram needs 3 characters).
SUBSTRING_MIN_CHARS = 3
#: Upper bound appended to a prefix for an index range scan (the largest code point).
_PREFIX_END = "\U0010ffff"


# --------------------------------------------------------------------------- status counts


def _planner_estimate(queryset: QuerySet) -> int | None:
    """PostgreSQL's row estimate for ``queryset`` (``EXPLAIN (FORMAT JSON)``, nothing executed), or None."""
    if connection.vendor != "postgresql":
        return None
    sql, params = queryset.order_by().values("pk").query.sql_with_params()
    with connection.cursor() as cur:
        cur.execute("EXPLAIN (FORMAT JSON) " + sql, params)
        plan = cur.fetchone()[0]
    if isinstance(plan, str):
        plan = json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"])


def status_count(queryset: QuerySet, status: str) -> tuple[int, str]:
    """``(number, label)`` of runs with ``status`` in ``queryset``: exact up to ``COUNT_CAP``, then ``≈`` / ``+``."""
    counted = queryset.filter(status=status).order_by().values("pk")[: COUNT_CAP + 1].count()
    if counted <= COUNT_CAP:
        return counted, f"{counted:,}"
    estimate = _planner_estimate(queryset.filter(status=status))
    if estimate is not None and estimate > COUNT_CAP:
        return estimate, f"≈ {_round(estimate)}"
    return COUNT_CAP, f"{COUNT_CAP:,}+"


def _round(n: int) -> str:
    if n >= 1_000_000:
        return f"{n / 1_000_000:.1f}M"
    return f"{n / 1000:.0f}k"


class StatusCountFilter(admin.SimpleListFilter):
    """"By status", each status with its count among the non-expired runs (exact ≤ 1,000, else estimated)."""

    #: the counts are of every run, whatever the search and the other filters (docs/console.md)
    title = "status (counts of all runs)"
    parameter_name = "status__exact"

    def lookups(self, request, model_admin):
        base = model_admin.get_queryset(request)
        out = []
        for status in ("pending", "running", "completed", "failed", "cancelled"):
            _, label = status_count(base, status)
            title = "exact count" if not label.startswith("≈") and not label.endswith("+") else (
                f"more than {COUNT_CAP:,}: " + ("the planner's estimate" if label.startswith("≈") else "not counted further")
            )
            out.append((status, format_html('{} <span class="wc-count" title="{}">{}</span>', status, title, label)))
        return out

    def queryset(self, request, queryset):
        value = self.value()
        return queryset.filter(status=value) if value else queryset


# --------------------------------------------------------------------------- failure reason


def failure_annotation() -> dict:
    """The annotation ``wc_error_head``: the first ``FAILURE_HEAD_CHARS`` characters of ``error``."""
    return {"wc_error_head": Substr("error", 1, FAILURE_HEAD_CHARS)}


def failure_reason(head: str | None) -> str:
    """The first line of ``error.message`` from the head of a stored StructuredError ("" when none).

    ``head`` is codec text, maybe cut; a head that is not a StructuredError
    shows as its inline preview's text.
    """
    if not head:
        return ""
    try:
        value, _ = display.parse_json_prefix(head)
    except ValueError:
        return head[:200]
    if isinstance(value, dict):
        message = value.get("message")
        if isinstance(message, str):
            line = message.strip().splitlines()[0] if message.strip() else ""
            return line[:300]
    try:
        return json.dumps(codec.decode(head))[:200]
    except ValueError:
        return head[:200]


# --------------------------------------------------------------------------- duration


def run_duration_ms(run: Run, now_ms: int) -> tuple[int | None, bool]:
    """``(duration ms, still going)``: completedAt (or now) minus startedAt (or createdAt)."""
    start = run.started_at or run.created_at
    if start is None:
        return None, False
    if run.completed_at is not None:
        return codec.epoch_ms(run.completed_at) - codec.epoch_ms(start), False
    if run.status in TERMINAL_RUN:
        return None, False
    return now_ms - codec.epoch_ms(start), True


# --------------------------------------------------------------------------- search


def _prefix_q(field: str, term: str) -> Q:
    """``field`` starts with ``term``, as an index range (bytewise on SQLite's BINARY collation)."""
    return Q(**{f"{field}__gte": term, f"{field}__lt": term + _PREFIX_END})


def search_runs(queryset: QuerySet, term: str) -> QuerySet:
    """Runs of ``queryset`` matching ``term`` (see the module docstring; docs/console.md "Search").

    Each kind of match is its own index-driven query, newest first and capped
    at ``SEARCH_MATCHES`` runs, and the list is then filtered to the union of
    their run keys: no OR across the run and run-cell tables, which no index
    could serve. PostgreSQL: ``UPPER(col) LIKE UPPER('%term%')`` served by the
    trigram indexes. SQLite: prefix by index range, a substring only among
    the newest ``SQLITE_SCAN_ROWS`` runs. Both: exact step/hook id (event
    correlation id) and exact hook token. Bounded: at most 5 queries of at
    most ``SEARCH_MATCHES`` rows each.
    """
    term = term.strip()
    if not term:
        return queryset
    if not storable_text(term) or len(term) > MAX_TERM_CHARS:
        return queryset.none()
    cap = SEARCH_MATCHES
    pks = set(Event.objects.filter(correlation_id=term).order_by().values_list("run_id", flat=True).distinct()[:cap])
    pks.update(Hook.objects.filter(token=term).values_list("run_id", flat=True)[:cap])
    if connection.vendor == "postgresql":
        by_id = RunCellState.objects.filter(name__icontains=term)
        by_fields = Run.objects.filter(Q(workflow_name__icontains=term) | Q(deployment_id__icontains=term))
    else:
        by_id = RunCellState.objects.filter(_prefix_q("name", term))
        by_fields = Run.objects.filter(_prefix_q("workflow_name", term) | _prefix_q("deployment_id", term))
        if len(term) >= SUBSTRING_MIN_CHARS:
            newest = Run.objects.order_by("-created_at").values("pk")[:SQLITE_SCAN_ROWS]
            pks.update(
                Run.objects.filter(pk__in=newest)
                .filter(Q(cell__name__contains=term) | Q(workflow_name__contains=term) | Q(deployment_id__contains=term))
                .order_by("-created_at").values_list("pk", flat=True)[:cap]
            )
    pks.update(by_id.order_by("-pk").values_list("pk", flat=True)[:cap])  # run pk = its cell's pk
    pks.update(by_fields.order_by("-created_at").values_list("pk", flat=True)[:cap])
    return queryset.filter(pk__in=sorted(pks))


def runs_with_prefix(prefix: str, limit: int = 2) -> list[tuple[int, str]]:
    """Up to ``limit`` ``(run pk, run id)`` whose run id starts with ``prefix``, by id.

    PostgreSQL: ``UPPER(name) LIKE UPPER('prefix%')`` through the trigram index
    on the cell name (then the case is compared exactly); SQLite: an index range.
    """
    if not prefix or not storable_text(prefix) or len(prefix) > MAX_TERM_CHARS:
        return []
    cells = RunCellState.objects.filter(expired=False, run__isnull=False)
    if connection.vendor == "postgresql":
        # UPPER(name) LIKE UPPER('prefix%') is what the trigram index serves; the case is checked below
        cells = cells.filter(name__istartswith=prefix)
    else:
        cells = cells.filter(_prefix_q("name", prefix))
    found = cells.order_by("name").values_list("pk", "name")[: limit * 4]
    return [(pk, name) for pk, name in found if name.startswith(prefix)][:limit]
