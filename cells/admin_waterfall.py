"""The run page's waterfall: steps, waits (sleeps) and hooks as bars on one time axis.

Rendered on the server as positioned ``<div>`` bars (CSS only, no script):
``build_waterfall`` turns a run's step rows and the timing events of its log
into lanes, and ``templates/admin/cells/run/waterfall.html`` draws them. The
layout rules are in docs/console.md "Waterfall".

Bounded: at most ``MAX_STEP_LANES`` steps and ``MAX_TIMING_EVENTS`` timing
events are read (two queries, no payload column), whatever the size of the
run; a run with more says so above the chart.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from worldcell import codec
from worldcell.admin_site import format_duration_ms

from .event_machine import TERMINAL_RUN, TERMINAL_STEP
from .models import Event, Run, Step

__all__ = ["MAX_STEP_LANES", "MAX_TIMING_EVENTS", "Bar", "Lane", "Waterfall", "axis_ticks", "build_waterfall", "run_waterfall"]

#: Steps drawn at most (in creation order); the table below pages through all of them.
MAX_STEP_LANES = 500
#: Timing events (step starts and retries, waits, hooks) read at most.
MAX_TIMING_EVENTS = 5_000
#: Event types the waterfall reads (their bodies are never loaded).
TIMING_EVENT_TYPES = (
    "step_started", "step_retrying", "step_failed",
    "wait_created", "wait_completed",
    "hook_created", "hook_received", "hook_disposed", "hook_conflict",
)
#: Tick spacings the axis may use, in ms (1-2-5 steps from 1 ms to 1 day).
_TICK_STEPS_MS = (
    1, 2, 5, 10, 20, 50, 100, 200, 500,
    1_000, 2_000, 5_000, 10_000, 15_000, 30_000,
    60_000, 120_000, 300_000, 600_000, 900_000, 1_800_000,
    3_600_000, 7_200_000, 10_800_000, 21_600_000, 43_200_000, 86_400_000,
)


@dataclass
class Bar:
    """One lane's bar: ``start_ms``/``end_ms`` relative to the run's origin; ``open`` = still going."""

    start_ms: int
    end_ms: int
    open: bool = False
    marks: list[tuple[int, str, str]] = field(default_factory=list)  # (at ms, css kind, title)
    left_pct: float = 0.0
    width_pct: float = 0.0
    mark_pcts: list[tuple[float, str, str]] = field(default_factory=list)


@dataclass
class Lane:
    """One row of the chart: ``kind`` is ``step`` / ``wait`` / ``hook``; ``status`` picks the colour."""

    kind: str
    label: str
    status: str
    title: str
    bar: Bar
    url: str | None = None
    attempt: int = 0


@dataclass
class Waterfall:
    """The chart: lanes, axis ticks ``(pct, label)``, total span (ms) and what was left out."""

    lanes: list[Lane]
    ticks: list[tuple[float, str]]
    span_ms: int
    steps_cut: bool = False
    events_cut: bool = False


def axis_ticks(span_ms: int, *, target: int = 8) -> list[tuple[float, str]]:
    """Ticks for an axis of ``span_ms`` ms: ``[(percent 0..100, label)]`` at a 1-2-5 spacing.

    The spacing is the smallest of ``_TICK_STEPS_MS`` giving at most ``target``
    intervals; labels are in ms below 1 s, s below 1 min, then min and h.
    """
    span_ms = max(int(span_ms), 1)
    step = next((s for s in _TICK_STEPS_MS if span_ms / s <= target), None)
    if step is None:
        step = -(-span_ms // (target * 86_400_000)) * 86_400_000
    out = []
    at = 0
    while at <= span_ms:
        out.append((round(100.0 * at / span_ms, 3), _tick_label(at, step)))
        at += step
    return out


def _tick_label(at_ms: int, step_ms: int) -> str:
    """A tick's label in the unit of its own size: ``250 ms``, ``1.5 s``, ``2 min``, ``1.5 h``, ``2 d``."""
    if at_ms == 0:
        return "0"
    for unit_ms, unit in ((86_400_000, "d"), (3_600_000, "h"), (60_000, "min"), (1_000, "s")):
        if at_ms >= unit_ms:
            return f"{round(at_ms / unit_ms, 2):g} {unit}"
    return f"{at_ms} ms"


def build_waterfall(
    *,
    origin_ms: int,
    end_ms: int,
    steps: Iterable[dict[str, Any]],
    events: Iterable[tuple[str, str | None, int]],
    step_url: Any = None,
) -> Waterfall:
    """Lanes of a run from plain values (no database access; the rules of docs/console.md "Waterfall").

    Args:
        origin_ms: epoch ms of the axis' 0 (the run's createdAt).
        end_ms: epoch ms where open bars end (completedAt of a finished run, else now).
        steps: dicts ``step_id, step_name, status, attempt, created_ms, started_ms, completed_ms``
            (``*_ms`` epoch ms or None), in creation order.
        events: ``(event_type, correlation_id, created_ms)`` of the timing events, in log order.
        step_url: ``step_url(step_id) -> str`` for the lane links, or None.

    Returns:
        a ``Waterfall`` whose bars carry percentages of the span (at least 1 ms).
    """
    starts: dict[str, list[int]] = {}
    retries: dict[str, list[int]] = {}
    waits: dict[str, list[int | None]] = {}
    hooks: dict[str, dict[str, Any]] = {}
    for event_type, corr, at in events:
        if not corr:
            continue
        if event_type == "step_started":
            starts.setdefault(corr, []).append(at)
        elif event_type in ("step_retrying", "step_failed"):
            retries.setdefault(corr, []).append(at)
        elif event_type == "wait_created":
            waits.setdefault(corr, [at, None])
        elif event_type == "wait_completed":
            waits.setdefault(corr, [at, None])[1] = at
        elif event_type in ("hook_created", "hook_conflict"):
            hooks.setdefault(corr, {"start": at, "end": None, "received": [], "conflict": event_type == "hook_conflict"})
        elif event_type == "hook_received":
            hooks.setdefault(corr, {"start": at, "end": None, "received": [], "conflict": False})["received"].append(at)
        elif event_type == "hook_disposed":
            hooks.setdefault(corr, {"start": at, "end": None, "received": [], "conflict": False})["end"] = at

    lanes: list[Lane] = []
    last = end_ms
    for s in steps:
        sid = s["step_id"]
        begin = s["started_ms"] if s["started_ms"] is not None else s["created_ms"]
        done = s["completed_ms"]
        is_open = done is None and s["status"] not in TERMINAL_STEP
        finish = done if done is not None else end_ms
        bar = Bar(begin - origin_ms, max(finish, begin) - origin_ms, open=is_open)
        attempts = starts.get(sid, [])
        for n, at in enumerate(attempts[1:], start=2):
            bar.marks.append((at - origin_ms, "retry", f"attempt {n} started +{format_duration_ms(at - origin_ms)}"))
        for at in retries.get(sid, []):
            bar.marks.append((at - origin_ms, "fail", f"attempt failed +{format_duration_ms(at - origin_ms)}"))
        took = format_duration_ms(finish - begin) + (" so far" if is_open else "")
        attempt = int(s["attempt"] or 0)
        lanes.append(Lane(
            kind="step", label=s["step_name"] or sid, status=s["status"], attempt=attempt,
            title=f"{s['step_name']} ({sid}) · {s['status']} · attempt {attempt} · {took}",
            bar=bar, url=step_url(sid) if step_url else None,
        ))
        last = max(last, finish)
    for wid, (begin, done) in waits.items():
        is_open = done is None
        finish = done if done is not None else end_ms
        lanes.append(Lane(
            kind="wait", label=f"sleep {wid}", status="running" if is_open else "completed",
            title=f"wait {wid} · {'waiting' if is_open else 'done'} · {format_duration_ms(finish - begin)}",
            bar=Bar(begin - origin_ms, max(finish, begin) - origin_ms, open=is_open),
        ))
    for hid, h in hooks.items():
        is_open = h["end"] is None
        finish = h["end"] if h["end"] is not None else end_ms
        bar = Bar(h["start"] - origin_ms, max(finish, h["start"]) - origin_ms, open=is_open)
        for at in h["received"]:
            bar.marks.append((at - origin_ms, "recv", f"payload received +{format_duration_ms(at - origin_ms)}"))
        status = "failed" if h["conflict"] else ("running" if is_open else "completed")
        lanes.append(Lane(
            kind="hook", label=hid if hid.startswith("hook") else f"hook {hid}", status=status,
            title=f"hook {hid} · {len(h['received'])} received · {'live' if is_open else 'disposed'}",
            bar=bar,
        ))
    lanes.sort(key=lambda lane: lane.bar.start_ms)
    span = max(last - origin_ms, max((lane.bar.end_ms for lane in lanes), default=0), 1)
    for lane in lanes:
        b = lane.bar
        b.left_pct = round(100.0 * max(b.start_ms, 0) / span, 3)
        b.width_pct = round(max(100.0 * (b.end_ms - max(b.start_ms, 0)) / span, 0.0), 3)
        b.mark_pcts = [(round(100.0 * max(at, 0) / span, 3), kind, title) for at, kind, title in b.marks]
    return Waterfall(lanes=lanes, ticks=axis_ticks(span), span_ms=span)


def run_waterfall(run: Run, now_ms: int, step_url: Any = None) -> Waterfall:
    """The waterfall of ``run``: two bounded queries (steps' time columns, timing events' heads)."""
    steps = list(
        Step.objects.filter(run=run)
        .order_by("sort_key")
        .values_list("step_id", "step_name", "status", "attempt", "created_at", "started_at", "completed_at")[
            : MAX_STEP_LANES + 1
        ]
    )
    events = list(
        Event.objects.filter(run=run, event_type__in=TIMING_EVENT_TYPES)
        .order_by("event_id")
        .values_list("event_type", "correlation_id", "created_at")[: MAX_TIMING_EVENTS + 1]
    )
    ms = lambda v: None if v is None else codec.epoch_ms(v)  # noqa: E731
    origin = codec.epoch_ms(run.created_at)
    end = ms(run.completed_at) if run.completed_at is not None else (
        codec.epoch_ms(run.updated_at) if run.status in TERMINAL_RUN else now_ms
    )
    chart = build_waterfall(
        origin_ms=origin,
        end_ms=end,
        steps=[
            {"step_id": sid, "step_name": name, "status": status, "attempt": attempt,
             "created_ms": ms(created), "started_ms": ms(started), "completed_ms": ms(completed)}
            for sid, name, status, attempt, created, started, completed in steps[:MAX_STEP_LANES]
        ],
        events=[(t, c, codec.epoch_ms(at)) for t, c, at in events[:MAX_TIMING_EVENTS]],
        step_url=step_url,
    )
    chart.steps_cut = len(steps) > MAX_STEP_LANES
    chart.events_cut = len(events) > MAX_TIMING_EVENTS
    return chart
