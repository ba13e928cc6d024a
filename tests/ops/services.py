"""Private PostgreSQL and Redis servers for fault tests (never the shared ones).

``private_postgres(port)`` runs ``initdb`` into a temporary directory and a
``postgres`` of its own on 127.0.0.1:``port`` (socket in the same directory);
``private_redis(port)`` a ``redis-server`` without persistence. Both yield an
object with ``stop()`` / ``start()`` so a test can take the service away and
bring it back, and stop everything at the end.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

PG_BIN = Path("/usr/lib/postgresql/15/bin")


def _pg_bin(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    return str(PG_BIN / name)


def _as_postgres(cmd: list[str]) -> list[str]:
    """Run as the ``postgres`` user when we are root (initdb and postgres refuse root)."""
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


def wait_port(port: int, timeout_s: float = 20, up: bool = True) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            s.settimeout(0.2)
            is_up = s.connect_ex(("127.0.0.1", port)) == 0
        if is_up == up:
            return
        time.sleep(0.05)
    raise RuntimeError(f"port {port} did not go {'up' if up else 'down'}")


class Service:
    def __init__(self, cmd: list[str], port: int, log: Path, ready=None, pidfile: Path | None = None):
        self.cmd, self.port, self.log, self.ready, self.pidfile = cmd, port, log, ready, pidfile
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_port(self.port)
        if self.ready:
            self.ready()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            if self.pidfile is not None and self.pidfile.exists():
                # the server itself, not runuser in front of it
                os.kill(int(self.pidfile.read_text().split()[0]), signal.SIGINT)  # postgres: fast shutdown
            else:
                self.proc.send_signal(signal.SIGINT)  # redis: exit
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        wait_port(self.port, up=False)


@contextlib.contextmanager
def private_postgres(port: int):
    """A throwaway PostgreSQL cluster on 127.0.0.1:``port``; yields a Service with ``.url`` (database ``postgres``)."""
    root = Path(tempfile.mkdtemp(prefix="wc-ops-pg-"))
    data = root / "data"
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    subprocess.run(_as_postgres([_pg_bin("initdb"), "-D", str(data), "-A", "trust", "-U", "postgres",
                                 "--no-sync", "-E", "UTF8"]), check=True, capture_output=True)
    cmd = _as_postgres([str(PG_BIN / "postgres"), "-D", str(data), "-p", str(port), "-k", str(root),
                        "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "max_connections=60",
                        "-c", "wal_level=replica"])
    svc = Service(cmd, port, Path(tempfile.gettempdir()) / f"wc-ops-pg-{port}.log", pidfile=data / "postmaster.pid")
    svc.url = f"postgres://postgres@127.0.0.1:{port}/postgres"
    try:
        svc.start()
        time.sleep(0.3)  # past "database system is ready"
        yield svc
    finally:
        svc.stop()
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def private_redis(port: int):
    """A throwaway redis-server on 127.0.0.1:``port``; yields a Service with ``.url``."""
    cmd = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
           "--daemonize", "no"]
    svc = Service(cmd, port, Path(tempfile.gettempdir()) / f"wc-ops-redis-{port}.log")
    svc.url = f"redis://127.0.0.1:{port}/0"
    try:
        svc.start()
        yield svc
    finally:
        svc.stop()
