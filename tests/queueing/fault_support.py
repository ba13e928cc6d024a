"""Fault-test tooling: a private redis-server, real Celery workers and beat, a ledger of deliveries.

* ``RedisServer(port)`` — ``redis-server`` on 127.0.0.1:``port`` (no persistence);
  ``stop()`` kills it (a broker outage: queued tasks are lost), ``start()``
  brings it back on the same port.
* ``FleetProc`` — ``celery -A worldcell worker|beat`` pointed at the test
  database and a broker, with its output in a log file; ``kill9()``,
  ``stop()``.
* ``fleet_database_url(application_name)`` — the pytest-django test database as
  a ``DATABASE_URL`` (the fleet's backends carry ``application_name``, so a
  test can terminate exactly those).
* ``use_broker(url)`` — point this process's Celery app (its wake-up sends) at ``url``.
* ``Ledger`` — a sink script that records every POST and success per message id.

Only loopback, only ports the caller passes (parallel test sessions pick
their own, see ``TEST_FAULT_PORT_BASE``).
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Callable
from urllib.parse import quote

from django.db import connection

from .support import Answer, Recorded

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
#: parallel test sessions on one machine set this to keep their private servers apart
PORT_BASE = int(os.environ.get("TEST_FAULT_PORT_BASE", "18610"))


def use_broker(url: str) -> Callable[[], None]:
    """Point this process's Celery app at broker ``url`` (sends included); returns the undo.

    Celery resolves ``broker_write_url`` from ``broker_url`` once and caches its
    connection and producer pools, so all of them are reset.
    """
    from worldcell.celery import app

    old = app.conf.broker_url, app.conf.broker_write_url

    def point(broker_url: str, write_url: str) -> None:
        app.conf.broker_url, app.conf.broker_write_url = broker_url, write_url
        app._pool = None
        app.amqp._producer_pool = None

    point(url, url)
    return lambda: point(*old)


def redis_available() -> bool:
    return shutil.which("redis-server") is not None


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class RedisServer:
    """A private ``redis-server`` on 127.0.0.1:``port`` with no persistence (a restart loses everything)."""

    def __init__(self, port: int, log_path: Path):
        self.port = port
        self.url = f"redis://127.0.0.1:{port}/0"
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 10) -> "RedisServer":
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--daemonize", "no"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"redis-server on {self.port} did not start")

    def stop(self) -> None:
        """Kill the server (SIGKILL: an outage, not a clean shutdown)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None


def fleet_database_url(application_name: str) -> str:
    """The current test database as a URL whose connections carry ``application_name``."""
    s = connection.settings_dict
    auth = quote(s["USER"] or "postgres")
    if s.get("PASSWORD"):
        auth += ":" + quote(s["PASSWORD"])
    return (
        f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"
        f"?application_name={quote(application_name)}"
    )


def fleet_env(tmp: Path, db_url: str, broker_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "QUEUE_", "CELERY_"))}
    env.update(
        DATABASE_URL=db_url,
        CELERY_BROKER_URL=broker_url,
        WORLDCELL_USE_CELERY="true",
        WORLDCELL_DATA_DIR=str(tmp),
        DJANGO_SETTINGS_MODULE="worldcell.settings",
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


class FleetProc:
    """``celery -A worldcell worker`` (threads pool) or ``beat``, started and waited for."""

    def __init__(self, kind: str, name: str, tmp: Path, env: dict[str, str], timeout_s: float = 60):
        self.name = name
        self.log_path = tmp / f"{name}.log"
        self._log = open(self.log_path, "ab")
        if kind == "worker":
            cmd = [str(BIN / "celery"), "-A", "worldcell", "worker", "--pool", "threads", "--concurrency", "4",
                   "--loglevel", "INFO", "--without-gossip", "--without-mingle", "--without-heartbeat",
                   "--hostname", f"{name}@%h"]
            ready = " ready."
        else:
            cmd = [str(BIN / "celery"), "-A", "worldcell", "beat", "--loglevel", "INFO",
                   "--schedule", str(tmp / f"{name}-schedule")]
            ready = "beat: Starting"
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        self.pid = self.proc.pid
        deadline = time.monotonic() + timeout_s
        while ready not in self.text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{name} did not start:\n{self.text()[-3000:]}")
            time.sleep(0.1)

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill9(self) -> None:
        if self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


class Ledger:
    """Records every POST and every 2xx answer per message id; ``script`` picks the answer.

    Use as an ``HttpSink.script``: ``sink.script(ledger)``. ``decide(rec, nth)``
    (``nth`` = 1 for the first POST of that message) returns the ``Answer``;
    the default answers 200.
    """

    def __init__(self, decide: Callable[[Recorded, int], Answer] | None = None):
        self.decide = decide or (lambda rec, nth: Answer(200))
        self.lock = threading.Lock()
        self.posts: Counter[str] = Counter()
        self.successes: Counter[str] = Counter()
        self.first_success_at: dict[str, float] = {}

    def __call__(self, rec: Recorded) -> Answer:
        mid = rec.message_id or "?"
        with self.lock:
            self.posts[mid] += 1
            nth = self.posts[mid]
        answer = self.decide(rec, nth)
        if 200 <= answer.status <= 299:
            with self.lock:
                self.successes[mid] += 1
                self.first_success_at.setdefault(mid, time.time())
        return answer

    def duplicates(self) -> dict[str, int]:
        """Message ids answered 2xx more than once, with their count."""
        with self.lock:
            return {m: n for m, n in self.successes.items() if n > 1}


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.05) -> float:
    """Wait for ``predicate()``; returns the seconds it took; AssertionError on timeout."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if predicate():
            return time.monotonic() - t0
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
