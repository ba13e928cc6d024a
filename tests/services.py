"""Private services and process environments for tests, defined once.

Every test that starts a server, a broker, a database cluster or a Celery
process takes it from here, so there is one way to do each:

* ``free_port()`` — a port the OS hands out (never a fixed number);
  ``refused_url()`` — an ``http://`` URL on a port held bound but not
  listening, so a connection to it is refused for the whole session.
* ``wait_port(port)``, ``wait_until(predicate, timeout_s, what)`` (the seconds it took),
  ``wait_for(...)`` (the predicate's value) — waits for the event itself (a port opening or closing, a condition), never a fixed sleep.
* ``Service`` with ``private_postgres()`` (``initdb`` + ``postgres``) and
  ``private_redis()`` (``redis-server`` without persistence): a test can
  ``stop()`` (clean shutdown), ``kill()`` (SIGKILL: an outage) and ``start()``
  it again on the same port; both stop everything at the end.
* ``session_redis()`` — one private redis-server per test process, started on
  first use and stopped at exit: the broker of every Celery test that does not
  take Redis away itself (so parallel sessions and xdist workers never share a
  broker; nothing of the machine's Redis is touched). Fixture ``broker_url``
  (``tests/conftest.py``) empties it for each test.
* ``test_database_url(application_name)`` — the pytest-django test database as
  a ``DATABASE_URL`` for subprocesses; ``fresh_database(tmp_path)`` — a new empty
  database of the suite's kind, dropped afterwards.
* ``process_env(db_url, data_dir, ...)`` — the environment of every fleet
  subprocess; ``CeleryProc`` — ``celery -A worldcell worker|beat`` started and
  waited for, with ``kill9()`` / ``stop()``.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
BIN = Path(PY).parent
PG_BIN = Path("/usr/lib/postgresql/15/bin")


# --------------------------------------------------------------------------- ports and waits


def free_port() -> int:
    """A port the OS picks (bound once and released; the caller binds it next)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_refused: socket.socket | None = None
_refused_lock = threading.Lock()


def refused_url() -> str:
    """``http://127.0.0.1:<port>`` where nothing ever listens: the port stays bound (not listening) by this process."""
    global _refused
    with _refused_lock:
        if _refused is None:
            _refused = socket.socket()
            _refused.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{_refused.getsockname()[1]}"


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


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


def wait_until(predicate: Callable[[], Any], timeout_s: float = 10.0, what: str = "condition",
               poll_s: float = 0.05) -> float:
    """Wait for ``predicate()`` to be true; returns the seconds it took; AssertionError on timeout."""
    t0 = time.monotonic()
    while True:
        if predicate():
            return time.monotonic() - t0
        if time.monotonic() - t0 >= timeout_s:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(poll_s)


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.05) -> Any:
    """Wait for ``predicate()`` to return something true, and return it; AssertionError on timeout."""
    found: list[Any] = []
    wait_until(lambda: found.append(predicate()) or found[-1], timeout_s, what, poll_s)
    return found[-1]


def in_thread(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``fn`` for a thread of its own: the thread closes its own database connection when done."""

    def run(*args: Any) -> Any:
        from django.db import connection

        try:
            return fn(*args)
        finally:
            connection.close()

    return run


# --------------------------------------------------------------------------- private servers


def _pg_bin(name: str) -> str:
    return shutil.which(name) or str(PG_BIN / name)


def _as_postgres(cmd: list[str]) -> list[str]:
    """Run as the ``postgres`` user when we are root (initdb and postgres refuse root)."""
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


def _redis_pong(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class Service:
    """A server process on 127.0.0.1:``port``: ``start()``, ``stop()`` (clean), ``kill()`` (SIGKILL)."""

    def __init__(self, cmd: list[str], port: int, log: Path, ready: Callable[[], bool] | None = None,
                 pidfile: Path | None = None, url: str = ""):
        self.cmd, self.port, self.log, self.ready, self.pidfile, self.url = cmd, port, log, ready, pidfile, url
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 20) -> "Service":
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_port(self.port, timeout_s)
        if self.ready is not None:
            wait_until(self.ready, timeout_s, f"{Path(self.cmd[-1]).name} on {self.port} to be ready")
        return self

    def _server_pid(self) -> int | None:
        """The server itself (not ``runuser`` in front of it)."""
        if self.pidfile is not None and self.pidfile.exists():
            return int(self.pidfile.read_text().split()[0])
        return self.proc.pid if self.proc is not None else None

    def stop(self) -> None:
        """A clean shutdown (postgres: fast shutdown; redis: exit); waits for the port to close."""
        self._signal(signal.SIGINT)

    def kill(self) -> None:
        """SIGKILL: an outage, not a shutdown (redis loses whatever it held)."""
        self._signal(signal.SIGKILL)

    def _signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            pid = self._server_pid()
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        wait_port(self.port, up=False)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def _pg_ready(port: int) -> Callable[[], bool]:
    def ready() -> bool:
        return subprocess.run([_pg_bin("pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(port)],
                              capture_output=True).returncode == 0
    return ready


@contextlib.contextmanager
def private_postgres(port: int | None = None):
    """A throwaway PostgreSQL cluster on 127.0.0.1:``port`` (the OS picks one by default).

    Yields a ``Service`` whose ``.url`` is its database ``postgres``.
    """
    port = port or free_port()
    root = Path(tempfile.mkdtemp(prefix="wc-pg-"))
    data = root / "data"
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    subprocess.run(_as_postgres([_pg_bin("initdb"), "-D", str(data), "-A", "trust", "-U", "postgres",
                                 "--no-sync", "-E", "UTF8"]), check=True, capture_output=True)
    cmd = _as_postgres([str(PG_BIN / "postgres"), "-D", str(data), "-p", str(port), "-k", str(root),
                        "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "max_connections=60",
                        "-c", "wal_level=replica"])
    svc = Service(cmd, port, root.parent / f"wc-pg-{port}.log", ready=_pg_ready(port),
                  pidfile=data / "postmaster.pid", url=f"postgres://postgres@127.0.0.1:{port}/postgres")
    try:
        svc.start()
        yield svc
    finally:
        svc.stop()
        shutil.rmtree(root, ignore_errors=True)


def redis_service(port: int | None = None, log: Path | None = None) -> Service:
    """A ``redis-server`` without persistence on 127.0.0.1:``port``, not started yet."""
    port = port or free_port()
    cmd = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
           "--daemonize", "no"]
    log = log or Path(tempfile.gettempdir()) / f"wc-redis-{port}.log"
    return Service(cmd, port, log, ready=lambda: _redis_pong(port), url=f"redis://127.0.0.1:{port}/0")


def redis_available() -> bool:
    return shutil.which("redis-server") is not None


@contextlib.contextmanager
def private_redis(port: int | None = None, log: Path | None = None):
    """A throwaway redis-server (the OS picks the port by default); yields a started ``Service``."""
    svc = redis_service(port, log)
    try:
        yield svc.start()
    finally:
        svc.stop()


_session_redis: Service | None = None


def session_redis() -> Service:
    """This test process's own redis-server, started on first use and stopped when the process exits."""
    global _session_redis
    if _session_redis is None or not _session_redis.alive():
        _session_redis = redis_service().start()
        atexit.register(_session_redis.stop)
    return _session_redis


# --------------------------------------------------------------------------- databases


def _url(settings_dict: dict, name: str, application_name: str | None = None) -> str:
    auth = quote(settings_dict["USER"] or "postgres")
    if settings_dict.get("PASSWORD"):
        auth += ":" + quote(settings_dict["PASSWORD"])
    url = f"postgres://{auth}@{settings_dict['HOST'] or '127.0.0.1'}:{settings_dict['PORT'] or 5432}/{name}"
    return url + (f"?application_name={quote(application_name)}" if application_name else "")


def suite_is_postgres() -> bool:
    from django.conf import settings

    return settings.DATABASES["default"]["ENGINE"].endswith("postgresql")


def test_database_url(application_name: str | None = None) -> str:
    """The current (pytest-django) PostgreSQL test database as a URL; its backends carry ``application_name``."""
    from django.db import connection

    return _url(connection.settings_dict, connection.settings_dict["NAME"], application_name)


test_database_url.__test__ = False  # a helper, not a test


@contextlib.contextmanager
def fresh_database(tmp_path: Path):
    """A brand-new empty database of the suite's kind; yields its ``DATABASE_URL`` and drops it after.

    PostgreSQL: ``worldcell_t_<hex>`` on the suite's server; SQLite: a file in ``tmp_path``.
    """
    if not suite_is_postgres():
        yield f"sqlite:///{tmp_path / 'fleet.sqlite3'}"
        return
    import psycopg
    from django.conf import settings

    db = settings.DATABASES["default"]
    name = f"worldcell_t_{uuid.uuid4().hex[:8]}"
    admin = f"host={db['HOST'] or '127.0.0.1'} port={db['PORT'] or 5432} user={db['USER'] or 'postgres'} dbname=postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _url(db, name)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --------------------------------------------------------------------------- fleet processes

#: variables of this (test) process a fleet subprocess must not inherit
_NOT_INHERITED = ("PYTEST_", "DJANGO_", "QUEUE_", "CELERY_")


def process_env(db_url: str, data_dir: Path, *, secret: str | None = None, broker_url: str | None = None,
                **extra: str) -> dict[str, str]:
    """The environment of a fleet subprocess: this one's, less test and fleet settings, plus these."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_NOT_INHERITED)}
    env.update(DATABASE_URL=db_url, WORLDCELL_DATA_DIR=str(data_dir), WORLDCELL_NO_BOOTSTRAP="1",
               DJANGO_SETTINGS_MODULE="worldcell.settings", PYTHONUNBUFFERED="1")
    if secret is not None:
        env["WORLD_SECRET"] = secret
    if broker_url is not None:
        env.update(CELERY_BROKER_URL=broker_url, WORLDCELL_USE_CELERY="true")
    env.update(extra)
    return env


def celery_command(kind: str, name: str, tmp: Path, *, concurrency: int = 4, heartbeat: bool = False
                   ) -> tuple[list[str], str]:
    """``celery -A worldcell worker`` (threads pool) or ``beat``; ``(argv, the log line that says it is ready)``."""
    if kind == "worker":
        return [str(BIN / "celery"), "-A", "worldcell", *worker_args(name, concurrency, heartbeat)], " ready."
    return [str(BIN / "celery"), "-A", "worldcell", "beat", "--loglevel", "INFO",
            "--schedule", str(tmp / f"{name}-schedule")], "beat: Starting"


def worker_args(name: str, concurrency: int = 4, heartbeat: bool = False) -> list[str]:
    """The worker's arguments as README.md gives them (threads pool), named ``name``; the fault tests
    drop the event heartbeat (``heartbeat=False``) so a broker outage is not also a heartbeat storm."""
    return ["worker", "--pool", "threads", "--concurrency", str(concurrency), "--loglevel", "INFO",
            "--without-gossip", "--without-mingle", *([] if heartbeat else ["--without-heartbeat"]),
            "--hostname", f"{name}@%h"]


class CeleryProc:
    """A Celery worker or beat subprocess with its output in ``<tmp>/<name>.log``, started and waited for.

    ``kind`` is ``"worker"`` or ``"beat"``; ``cmd`` (with ``ready``, the log line
    that says it is up) replaces the standard command line.
    """

    def __init__(self, kind: str, name: str, tmp: Path, env: dict[str, str], timeout_s: float = 60, *,
                 concurrency: int = 4, heartbeat: bool = False, cmd: list[str] | None = None,
                 ready: str | None = None):
        self.name = name
        self.log_path = tmp / f"{name}.log"
        self._log = open(self.log_path, "ab")
        standard, standard_ready = celery_command(kind, name, tmp, concurrency=concurrency, heartbeat=heartbeat)
        ready = ready or standard_ready
        self.proc = subprocess.Popen(cmd or standard, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT)
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
        """A warm shutdown (SIGTERM), then a kill after 20 s."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
