"""The live parts of the queue console: the dashboard fragment, the outcome chart, driver liveness, attempt logs.

``queueing.admin_dashboard`` and ``queueing.admin_messages`` wire these into their pages (docs/queue-console.md):

* ``live_context(now)`` — what the dashboard's self-refreshing fragment
  (``templates/admin/queueing/queuecell/live.html``, polled by htmx) shows:
  fleet totals, late alarms, the outcome chart of the last hour, outcomes per
  queue name, and beat / pump liveness. A fixed number of queries (seven),
  whatever the number of messages, attempts or minutes.
* ``outcome_chart(series)`` — a small server-side SVG: delivered / retried /
  dead-lettered / dropped per minute, stacked, summed over shards and queues.
* ``attempt_log_html(cell_id, message_id)`` — the attempt table of a message
  or dead-letter page (one query).

Every time shown is UTC and says so.
"""
from __future__ import annotations

from typing import Any

from django.db.models import Count, Min
from django.utils.html import escape, format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from worldcell import clock, codec
from worldcell.admin_site import format_duration_ms, format_epoch_ms

from . import attempt_log, config, liveness
from .models import DeadLetter, Message, QueueCell

__all__ = ["CHART_MINUTES", "attempt_log_html", "live_context", "outcome_chart"]

#: Minutes the outcome chart covers.
CHART_MINUTES = 60
#: Seconds between refreshes of the live dashboard fragment.
REFRESH_S = 5
#: An alarm this late (ms) means no driver is firing the cell (as ``queueing.admin_dashboard.ALARM_LATE_MS``).
ALARM_LATE_MS = 5_000

#: counter, label, colour (the same in light and dark mode: mid-tone fills)
SERIES = (
    ("delivered", "delivered", "#16a34a"),
    ("retried", "retried", "#d97706"),
    ("dead_lettered", "dead-lettered", "#dc2626"),
    ("dropped", "dropped", "#6b7280"),
)


def _utc_clock(ms: int) -> str:
    """``HH:MM`` of epoch ms, UTC."""
    return codec.format_iso(codec.from_epoch_ms(ms))[11:16]


def outcome_chart(series: dict[str, Any], width: int = 720, height: int = 150) -> SafeString:
    """An SVG bar chart of ``attempt_log.minute_series`` summed over queue names (stacked per minute).

    Each bar has a ``<title>`` with its minute (UTC) and counts; the y axis
    is labelled with the highest minute's total.
    """
    n = series["minutes"]
    per_minute = [dict.fromkeys(attempt_log.COUNTERS, 0) for _ in range(n)]
    for counters in series["queues"].values():
        for c in attempt_log.COUNTERS:
            for i, v in enumerate(counters[c]):
                per_minute[i][c] += v
    peak = max([sum(m.values()) for m in per_minute] + [0])
    left, bottom, top = 44, 20, 8
    plot_w, plot_h = width - left - 8, height - bottom - top
    bar_w = plot_w / n
    scale = plot_h / peak if peak else 0
    bars = []
    for i, counts in enumerate(per_minute):
        x = left + i * bar_w
        y = top + plot_h
        rects = []
        for key, _, colour in SERIES:
            h = counts[key] * scale
            if h > 0:
                y -= h
                rects.append(
                    f'<rect x="{x + 0.5:.1f}" y="{y:.1f}" width="{max(bar_w - 1, 1):.1f}" height="{h:.1f}" '
                    f'fill="{colour}"/>'
                )
        minute_ms = (series["start"] + i) * 60_000
        tip = f"{_utc_clock(minute_ms)} UTC: " + ", ".join(f"{counts[k]} {label}" for k, label, _ in SERIES)
        bars.append(
            f'<g class="wc-bar"><title>{escape(tip)}</title><rect x="{x:.1f}" y="{top}" width="{bar_w:.1f}" '
            f'height="{plot_h}" fill="transparent"/>{"".join(rects)}</g>'
        )
    first_ms, last_ms = series["start"] * 60_000, (series["start"] + n - 1) * 60_000
    axis = format_html(
        '<line x1="{l}" y1="{b}" x2="{r}" y2="{b}" class="wc-axis"/>'
        '<line x1="{l}" y1="{t}" x2="{l}" y2="{b}" class="wc-axis"/>'
        '<text x="{tx}" y="{ty}" text-anchor="end" class="wc-axis-text">{peak}</text>'
        '<text x="{tx}" y="{b}" text-anchor="end" class="wc-axis-text">0</text>'
        '<text x="{l}" y="{h}" class="wc-axis-text">{first} UTC</text>'
        '<text x="{r}" y="{h}" text-anchor="end" class="wc-axis-text">{last} UTC</text>',
        l=left, r=width - 8, t=top, b=top + plot_h, tx=left - 6, ty=top + 10, h=height - 4,
        peak=peak, first=_utc_clock(first_ms), last=_utc_clock(last_ms),
    )
    legend = format_html_join(
        " ", '<span class="wc-legend"><i style="background:{}"></i>{} {}</span>',
        ((colour, f"{series['totals'][key]:,}", label) for key, label, colour in SERIES),
    )
    return format_html(
        '<figure class="wc-chart"><svg viewBox="0 0 {w} {h}" width="100%" role="img" '
        'aria-label="delivery outcomes per minute, last {n} minutes">{axis}{bars}</svg>'
        '<figcaption>{legend} <span class="wc-note">in the last {n} min, per minute (UTC), all shards</span>'
        '</figcaption></figure>',
        w=width, h=height, n=n, axis=axis, bars=mark_safe("".join(bars)), legend=legend,
    )


def _queue_rows(series: dict[str, Any]) -> list[dict[str, Any]]:
    """Per queue name: the hour's totals per counter, busiest first."""
    rows = []
    for name, counters in series["queues"].items():
        totals = {c: sum(v) for c, v in counters.items()}
        rows.append({"name": name, **totals, "all": sum(totals.values())})
    rows.sort(key=lambda r: (-r["all"], r["name"]))
    return rows


def _drivers(now: int) -> list[dict[str, Any]]:
    out = []
    for d in liveness.drivers(now):
        out.append({
            **d,
            "label": "beat (through a worker)" if d["kind"] == "beat" else d["name"].removeprefix(liveness.PREFIX),
            "last": format_epoch_ms(d["at_ms"], now_ms=now),
            "age": format_duration_ms(d["age_ms"]),
        })
    return out


def live_context(now: int | None = None) -> dict[str, Any]:
    """Context of the live dashboard fragment (seven queries; see the module docstring)."""
    now = clock.now_ms() if now is None else now
    pending = Message.objects.filter(due_at__isnull=False).aggregate(n=Count("pk"), first=Min("due_at"))
    series = attempt_log.minute_series(CHART_MINUTES, now)
    first = pending["first"]
    if first is None:
        oldest = "none"
    elif first <= now:
        late = now - first
        oldest = format_html('<span class="{}">due {} ago</span>', "wc-late" if late > ALARM_LATE_MS else "",
                             format_duration_ms(late))
    else:
        oldest = format_html('<span class="wc-rel">next due in {}</span>', format_duration_ms(first - now))
    drivers = _drivers(now)
    return {
        "totals": {
            "cells": QueueCell.objects.count(),
            "pending": pending["n"],
            "inflight": Message.objects.filter(inflight_deadline__isnull=False).count(),
            "dead": DeadLetter.objects.count(),
        },
        "oldest_due": oldest,
        "late_alarms": QueueCell.objects.filter(alarm_at__lt=now - ALARM_LATE_MS).count(),
        "chart": outcome_chart(series),
        "outcome_totals": series["totals"],
        "queue_rows": _queue_rows(series),
        "drivers": drivers,
        "drivers_stale": sum(d["stale"] for d in drivers),
        "refreshed": format_epoch_ms(now, relative=False),
        "refreshed_iso": codec.format_iso(codec.from_epoch_ms(now)).replace("T", " ").rstrip("Z")[:19],
        "refresh_s": REFRESH_S,
        "config": {
            "max_attempts": config.max_attempts(),
            "max_inflight": config.max_inflight(),
            "delivery_timeout": format_duration_ms(config.delivery_timeout_ms()),
        },
    }


def attempt_log_html(cell_id: int, message_id: str, now: int | None = None) -> SafeString:
    """The logged attempts of a message, newest first, as a table (one query); a note when there are none."""
    now = clock.now_ms() if now is None else now
    rows = attempt_log.attempts_of(cell_id, message_id)
    if not rows:
        return format_html(
            '<span class="wc-note">No failed attempt logged (the log keeps the last {} failed POSTs of a live '
            "message or dead letter).</span>", attempt_log.KEEP_PER_MESSAGE,
        )
    body = format_html_join(
        "", '<tr><td class="wc-nowrap">{}</td><td>{}</td><td class="wc-nowrap">{}</td><td>{}</td>'
        '<td class="wc-nowrap">{}</td><td class="wc-head"><code title="{}">{}</code></td></tr>',
        (
            (
                a.attempt, format_epoch_ms(a.started_at, now_ms=now), format_duration_ms(a.duration_ms),
                format_html('<span class="wc-error">{}</span>', a.error or f"HTTP {a.status}")
                if a.status is None or a.status >= 300 else a.status,
                a.result, a.answer_head or "", a.answer_head if a.answer_head else "—",
            )
            for a in rows
        ),
    )
    return format_html(
        '<table class="wc-attempts"><thead><tr><th>#</th><th>started (UTC)</th><th>took</th>'
        "<th>status / error</th><th>then</th><th>answer (first {} bytes)</th></tr></thead><tbody>{}</tbody></table>",
        attempt_log.HEAD_BYTES, body,
    )


def body_title(stored: Any, chars: int = 400) -> str:
    """Plain text of a queue body preview for a tooltip (the first ``chars`` characters), or ""."""
    import json

    from worldcell import display

    if stored is None:
        return ""
    try:
        value, complete = display.queue_body_value(stored)
    except ValueError:
        return stored.head[:chars]
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value, ensure_ascii=False, default=str)
        except (TypeError, ValueError):
            text = str(value)
    return text if len(text) <= chars and complete else text[: chars - 1] + "…"
