"""``python manage.py retention [--dry-run | --now] [--batch N]`` — the run retention sweep (docs/lifecycle.md).

Without options: the policy (``WORLDCELL_RUN_RETENTION``, ``WORLDCELL_MAX_RUN_AGE``,
batch size), tombstone counts and the last sweep. ``--dry-run`` lists the
runs the next sweep would expire and writes nothing. ``--now`` runs one
sweep (``--all``: repeat until nothing due is left). A thin shell over
``cells.lifecycle.sweep`` and ``cells.lifecycle.status``, like ``clearsessions``.
"""
from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from cells import lifecycle
from worldcell import codec


def _when(ms: int | None) -> str:
    return "never" if ms is None else codec.format_iso(codec.from_epoch_ms(ms))


class Command(BaseCommand):
    help = "Show the run retention policy and last sweep; list (--dry-run) or expire (--now) due runs."

    def add_arguments(self, parser):
        group = parser.add_mutually_exclusive_group()
        group.add_argument("--dry-run", action="store_true", help="list the runs the next sweep would expire")
        group.add_argument("--now", action="store_true", help="run one sweep now")
        parser.add_argument("--all", action="store_true", help="with --now: sweep until no due run is left")
        parser.add_argument("--batch", type=int, default=None, help="runs per sweep (1..1000; default the setting)")

    def handle(self, *args, **opts):
        batch = opts["batch"]
        if batch is not None and not 1 <= batch <= 1000:
            raise CommandError("--batch must be from 1 to 1000")
        if opts["dry_run"]:
            report = lifecycle.sweep(batch=batch, dry_run=True)
            if not report.enabled:
                self.stdout.write("retention is off (WORLDCELL_RUN_RETENTION and WORLDCELL_MAX_RUN_AGE unset)")
                return
            for c in report.candidates:
                self.stdout.write(f"{c['runId']}  {c['status']:<9}  expires {codec.format_iso(c['expiresAt'])}  "
                                  f"({c['reason']})")
            self.stdout.write(f"{len(report.candidates)} run(s) would expire (dry run: nothing written)")
            return
        if opts["now"]:
            while True:
                report = lifecycle.sweep(batch=batch)
                if report.busy:
                    raise CommandError("another sweep holds the lease; try again later")
                self.stdout.write(
                    f"expired {report.expired}, finished {report.cleaned} cleanup(s) ({report.resumed} resumed), "
                    f"{report.waiting} waiting, {report.stragglers} late queue row(s) removed, "
                    f"{report.failed} failed, {report.rate} runs/s"
                )
                if not (opts["all"] and report.more):
                    break
            return
        st = lifecycle.status()
        self.stdout.write(f"terminal-run retention (WORLDCELL_RUN_RETENTION): {lifecycle.describe_ms(st['retentionMs'])}")
        self.stdout.write(f"maximum run age (WORLDCELL_MAX_RUN_AGE): {lifecycle.describe_ms(st['maxAgeMs'])}")
        self.stdout.write(f"batch (WORLDCELL_RETENTION_BATCH): {st['batch']} runs per sweep")
        self.stdout.write(f"tombstones: {st['tombstones']} ({st['cleaning']} still being cleaned)")
        self.stdout.write(f"last sweep: started {_when(st['lastStartedAt'])}, finished {_when(st['lastFinishedAt'])}")
        if st["lastResult"]:
            r = st["lastResult"]
            self.stdout.write(f"  expired {r.get('expired', 0)}, cleaned {r.get('cleaned', 0)}, "
                              f"failed {r.get('failed', 0)}, {r.get('rate', 0)} runs/s")
