"""``python manage.py devfleet`` — the embedded fleet in one process.

What it does, in order:

1. pins itself to one CPU core (``--cpu``, default the highest-numbered one it
   may use: ``worldcell.affinity``) and forces the broker off
   (``WORLDCELL_USE_CELERY = False``): the queue is driven by the in-process
   pump, no Redis or Celery needed;
2. applies migrations to the configured database (a SQLite file under
   ``./data`` unless ``DATABASE_URL`` says otherwise) and collects the static
   files (``collectstatic``: the console's CSS/JS, compressed, content-hashed,
   served by whitenoise; docs/operations.md "Static files");
3. takes ``WORLD_SECRET`` from the environment, or reuses the one it generated
   on an earlier start (``data/world-secret``), or generates and saves a new one;
4. prints the environment lines a Node app needs;
5. starts the alarm pump (a tick every 25 ms) and its delivery thread pool —
   the same queue services the Celery tasks call;
6. serves the RPC API and the admin with waitress (a production WSGI server)
   on 127.0.0.1:8787 by default;
7. on Ctrl-C / SIGTERM: stops accepting requests, stops claiming, waits for
   in-flight deliveries up to ``--drain-seconds`` (anything still in flight is
   redelivered after its claim deadline on the next start), exits 0.
"""
from __future__ import annotations

import logging
import os
import secrets
import signal
import sys
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

log = logging.getLogger("worldcell.devfleet")


def load_or_create_secret(data_dir: Path) -> tuple[str, str]:
    """The world secret and where it came from: ``("…", "environment"|"file"|"generated")``.

    A generated secret is written to ``<data_dir>/world-secret`` (mode 0600) so a
    restarted fleet keeps accepting the Node app's configuration.
    """
    if settings.WORLD_SECRET:
        return settings.WORLD_SECRET, "environment"
    path = data_dir / "world-secret"
    if path.exists():
        text = path.read_text().strip()
        if text:
            return text, "file"
    secret = secrets.token_urlsafe(32)
    data_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(secret + "\n")
    os.chmod(path, 0o600)
    return secret, "generated"


def superuser_hint() -> str:
    """The ``createsuperuser`` command line for this fleet's database and data dir (shell-quoted)."""
    import shlex

    db_url = os.environ.get("DATABASE_URL")
    parts = []
    if db_url:
        parts.append("DATABASE_URL=" + shlex.quote(db_url))
    parts.append("WORLDCELL_DATA_DIR=" + shlex.quote(str(settings.DATA_DIR)))
    return " ".join(parts) + " python3 manage.py createsuperuser"


class Command(BaseCommand):
    help = "Run the whole fleet in one process: API server + in-process alarm pump, no broker."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=os.environ.get("WORLDCELL_HOST", "127.0.0.1"),
                            help="interface to listen on (default 127.0.0.1)")
        parser.add_argument("--port", type=int, default=int(os.environ.get("WORLDCELL_PORT", "8787")),
                            help="TCP port (default 8787)")
        parser.add_argument("--threads", type=int, default=32, help="HTTP worker threads (default 32)")
        parser.add_argument("--delivery-workers", type=int, default=16,
                            help="concurrent queue deliveries (default 16)")
        parser.add_argument("--drain-seconds", type=float, default=10.0,
                            help="on shutdown, how long to wait for in-flight deliveries (default 10)")
        parser.add_argument("--no-migrate", action="store_true", help="do not apply migrations at start")
        parser.add_argument("--no-collectstatic", action="store_true",
                            help="do not collect static files at start (they are then served unhashed)")
        parser.add_argument("--quiet", action="store_true", help="do not log each delivery")
        parser.add_argument("--cpu", default="auto",
                            help="pin the fleet to one core: auto (the highest-numbered one, default), a core "
                                 "number, or all (no pinning); docs/operations.md \"One core per process\"")

    def handle(self, *args, **opts):
        from waitress.server import create_server

        from queueing.pump import LocalPump

        from worldcell.affinity import AffinityError, choose_cpu, pin_process

        try:
            cpu = choose_cpu(opts["cpu"])
        except AffinityError as exc:
            raise CommandError(str(exc)) from exc
        if cpu is not None:
            try:
                pin_process(cpu)  # before the server's and the pump's threads start: they inherit it
            except OSError as exc:  # e.g. a container's cpuset narrower than the affinity mask
                log.warning("could not pin the fleet to core %s (%s); it runs unpinned", cpu, exc)
                cpu = None
        settings.WORLDCELL_USE_CELERY = False
        if not opts["no_migrate"]:
            call_command("migrate", interactive=False, verbosity=0)
        if not opts["no_collectstatic"]:
            call_command("collectstatic", interactive=False, verbosity=0)
        # imported after collectstatic: whitenoise indexes STATIC_ROOT when the app loads
        from worldcell.wsgi import application

        secret, origin = load_or_create_secret(Path(settings.DATA_DIR))
        settings.WORLD_SECRET = secret

        try:
            server = create_server(application, host=opts["host"], port=opts["port"],
                                   threads=opts["threads"], ident="worldcell",
                                   max_request_body_size=64 * 1024 * 1024, channel_timeout=330)
        except OSError as exc:
            raise CommandError(f"cannot listen on {opts['host']}:{opts['port']}: {exc}") from exc
        host, port = opts["host"], server.effective_port
        url = f"http://{host if ':' not in host else f'[{host}]'}:{port}"
        db = settings.DATABASES["default"]
        self.stdout.write(f"worldcell dev fleet listening on {url}")
        self.stdout.write(f"  database: {db['ENGINE'].rsplit('.', 1)[-1]} {db['NAME']}")
        self.stdout.write(f"  cpu: {f'core {cpu} (--cpu all: not pinned)' if cpu is not None else 'not pinned'}")
        self.stdout.write(f"  WORLD_SECRET: {origin}" + (f" ({Path(settings.DATA_DIR) / 'world-secret'})" if origin != "environment" else ""))
        self.stdout.write(f"  admin: {url}/admin/  create a login with the fleet's own settings:")
        self.stdout.write(f"    {superuser_hint()}")
        self.stdout.write("Point your Node app at it with:")
        self.stdout.write("  WORKFLOW_TARGET_WORLD=@ewhauser/world-celld")
        self.stdout.write(f"  CELLD_FLEET_URL={url}")
        self.stdout.write(f"  CELLD_WORLD_SECRET={secret}")
        self.stdout.flush()

        pump = LocalPump(max_workers=opts["delivery_workers"], log_deliveries=not opts["quiet"])
        pump.start()
        from cells.ticker import LifecycleTicker  # retention sweep + stuck-run repair (docs/lifecycle.md)

        ticker = LifecycleTicker().start()

        def _terminate(signum, frame):
            raise KeyboardInterrupt()

        # Install both explicitly: a fleet started in the background of a
        # non-interactive shell inherits SIGINT as ignored.
        signal.signal(signal.SIGINT, _terminate)
        signal.signal(signal.SIGTERM, _terminate)
        try:
            server.run()  # returns after KeyboardInterrupt, having stopped the HTTP threads
        except KeyboardInterrupt:
            pass
        finally:
            self.stdout.write("worldcell: shutting down: no longer accepting requests")
            try:
                server.close()
            except Exception:  # noqa: BLE001 - already closed by waitress
                pass
            ticker.stop()
            left = pump.stop(timeout_s=opts["drain_seconds"])
            if left:
                self.stdout.write(f"worldcell: {left} delivery(ies) still in flight; they will be redelivered after their claim deadline")
            self.stdout.write("worldcell: stopped")
        sys.exit(0)
