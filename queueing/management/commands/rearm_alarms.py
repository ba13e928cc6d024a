"""``python manage.py rearm_alarms [--queue q:0 ...] [--dry-run]`` — repair queue cell schedules.

For each queue cell (or only the named ones), in one transaction per cell:
claims past their deadline become due now, the alarm is recomputed from the
due messages and in-flight deadlines (``scheduleNextAlarm``, docs/protocol.md
§7.8), and the cell's driver (Celery or the local pump) is woken. Prints one
line per cell. ``--dry-run`` reports what would change and writes nothing.
A thin shell over ``queueing.machine.rearm_cell``.
"""
from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from queueing import machine, wake
from queueing.models import QueueCell
from worldcell import clock, codec


def _when(ms: int | None, now: int) -> str:
    if ms is None:
        return "none"
    delta = (ms - now) / 1000
    rel = f"in {delta:.1f}s" if delta >= 0 else f"{-delta:.1f}s ago"
    return f"{ms} ({codec.format_iso(codec.from_epoch_ms(ms))}, {rel})"


class Command(BaseCommand):
    help = "Recompute every queue cell's next alarm from its due messages and in-flight deadlines, and wake it."

    def add_arguments(self, parser):
        parser.add_argument(
            "--queue", action="append", dest="queues", metavar="NAME",
            help="only this queue cell (e.g. q:0); repeat for several",
        )
        parser.add_argument("--dry-run", action="store_true", help="report what would change; write nothing")

    def handle(self, *args, **opts):
        names = opts["queues"]
        if names:
            known = set(QueueCell.objects.filter(name__in=names).values_list("name", flat=True))
            unknown = [n for n in names if n not in known]
            if unknown:
                raise CommandError(f"unknown queue cell: {', '.join(unknown)}")
        else:
            names = list(QueueCell.objects.order_by("name").values_list("name", flat=True))
        if not names:
            self.stdout.write("no queue cells")
            return
        dry = opts["dry_run"]
        due_now = 0
        for name in names:
            now = clock.now_ms()
            report = machine.rearm_cell(name, now, dry_run=dry)
            if report is None:  # deleted meanwhile
                continue
            changes = []
            if report.recovered:
                changes.append(f"{report.recovered} expired claim(s) made due")
            if report.alarm_before != report.alarm_after:
                changes.append(f"alarm {report.alarm_before} -> {report.alarm_after}")
            if report.alarm_after is not None and report.alarm_after <= now + 1:
                due_now += 1
            self.stdout.write(
                f"{report.name}: pending={report.pending} inflight={report.inflight} "
                f"deadLetters={report.dead_letters} nextAlarm={_when(report.alarm_after, now)}; "
                f"{'would change' if dry else 'changed'}: {', '.join(changes) or 'nothing'}"
            )
        if dry:
            self.stdout.write("dry run: nothing was written")
        elif due_now:
            if settings.WORLDCELL_USE_CELERY:
                how = "woken through Celery"
            elif wake.current_pump() is not None:
                how = "woken through this process's pump"
            else:
                how = "left to the running fleet's pump (no broker)"
            self.stdout.write(f"{due_now} cell(s) with work due now: {how}")
