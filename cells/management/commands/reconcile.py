"""``python manage.py reconcile [--dry-run]`` — find and repair stuck runs (docs/lifecycle.md "Stuck-run repair").

Scans every active run; prints each stuck one (idle since, event sequence,
whether it can be repaired) and, unless ``--dry-run``, re-enqueues its
latest workflow message under the idempotency key ``repair:<runId>:<seq>``
(at most once per stuck state). A thin shell over ``cells.repair.reconcile``.
"""
from __future__ import annotations

from django.core.management.base import BaseCommand

from cells import repair
from worldcell import codec


class Command(BaseCommand):
    help = "List runs that nothing will resume and (unless --dry-run) re-enqueue their workflow message."

    def add_arguments(self, parser):
        parser.add_argument("--dry-run", action="store_true", help="list stuck runs; enqueue nothing")

    def handle(self, *args, **opts):
        if repair.threshold_ms() is None:
            self.stdout.write("stuck-run repair is off (WORLDCELL_STUCK_RUN_AFTER=off)")
            return
        report = repair.reconcile(dry_run=opts["dry_run"], full=True)
        for s in report.stuck:
            since = codec.format_iso(codec.from_epoch_ms(s.idle_since))
            note = "repairable" if s.repairable else f"not repairable: {s.reason}"
            self.stdout.write(f"{s.run_id}  {s.status:<8}  stuck since {since}  event {s.event_sequence}  {note}")
        verb = "would repair" if opts["dry_run"] else "repaired"
        count = sum(1 for s in report.stuck if s.repairable) if opts["dry_run"] else len(report.repaired)
        self.stdout.write(f"{len(report.stuck)} stuck run(s); {verb} {count}")
