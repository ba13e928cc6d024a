"""Start a real fleet in subprocesses for end-to-end tests.

* ``dev_fleet(db_url)`` — ``manage.py devfleet`` (waitress + in-process pump, no broker).
* ``celery_fleet(db_url)`` — ``manage.py migrate`` and ``collectstatic``, the API server as
  the README's production section starts it, a Celery worker (threads pool) and Celery beat,
  against PostgreSQL and Redis (or only some of them: ``processes``).
* ``api_server(kind, db_url)`` — ``manage.py migrate`` and one API server
  (``"waitress"`` or ``"gunicorn"``, the README's command lines) on a free port.
* ``fresh_database(tmp_path)``, ``free_port()``, ``base_env(...)`` — from ``tests/services.py``.

They yield ``(url, secret, processes)`` and stop every process afterwards.
"""
from __future__ import annotations

import contextlib
import shlex
import signal
import subprocess
import time
import uuid
from pathlib import Path

import httpx

from tests.services import PY, ROOT, celery_command, free_port, fresh_database, process_env  # noqa: F401  (re-exported)


README = ROOT / "README.md"
API_SERVERS = {"waitress": "waitress-serve", "gunicorn": "gunicorn"}
README_LISTEN = {"waitress": "127.0.0.1:8787", "gunicorn": "127.0.0.1:8000"}  # gunicorn sits behind nginx


def readme_api_command(kind: str, port: int) -> list[str]:
    """The README production section's command line for API server ``kind``, on ``port``.

    ``kind`` is ``"waitress"`` (the production command) or ``"gunicorn"`` (the
    commented alternative). The line is read from README.md so the tests start
    the server exactly as an operator would; raises LookupError when the README
    has no such line.
    """
    exe, listen = API_SERVERS[kind], README_LISTEN[kind]
    for line in README.read_text().splitlines():
        text = line.strip().removeprefix("# ").strip()
        if text.startswith(exe + " ") and listen in text:
            argv = shlex.split(text.replace(listen, f"127.0.0.1:{port}"))
            return [str(Path(PY).parent / argv[0]), *argv[1:]]
    raise LookupError(f"README.md has no {exe} command line listening on {listen}")


def wait_healthy(url: str, procs: list[subprocess.Popen], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"fleet process exited early: {p.args} rc={p.returncode}")
        try:
            if httpx.get(f"{url}/v1/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("fleet did not become healthy")


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGINT if "devfleet" in " ".join(map(str, p.args)) else signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def base_env(db_url: str, secret: str, data_dir: Path, **extra: str) -> dict[str, str]:
    """``tests.services.process_env`` with the fleet's ``WORLD_SECRET``."""
    return process_env(db_url, data_dir, secret=secret, **extra)


@contextlib.contextmanager
def _serving(cmd: list[str], env: dict[str, str], port: int, log_path: Path):
    """Run server ``cmd`` (output appended to ``log_path``) until it answers ``/v1/health``; yields ``(url, proc)``."""
    log = open(log_path, "ab")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, [proc])
        yield url, proc
    finally:
        _stop([proc])
        log.close()


@contextlib.contextmanager
def api_server(kind: str, db_url: str, data_dir: Path, log_path: Path, extra_env: dict[str, str] | None = None):
    """Migrate ``db_url`` and run API server ``kind`` as the README starts it; yields ``(url, secret, proc)``.

    No broker and no pump (``WORLDCELL_USE_CELERY=false``): accepted messages stay
    stored, nothing delivers them.
    """
    secret = uuid.uuid4().hex
    port = free_port()
    env = base_env(db_url, secret, data_dir, WORLDCELL_USE_CELERY="false", **(extra_env or {}))
    subprocess.run([PY, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True)
    with _serving(readme_api_command(kind, port), env, port, log_path) as (url, proc):
        yield url, secret, proc


@contextlib.contextmanager
def dev_fleet(db_url: str, data_dir: Path, log_path: Path, extra_env: dict[str, str] | None = None,
              args: tuple[str, ...] = ()):
    """Run ``manage.py devfleet`` (with ``args``) on a free port; yields ``(url, secret, process)``."""
    secret = uuid.uuid4().hex
    port = free_port()
    env = base_env(db_url, secret, data_dir, **(extra_env or {}))
    with _serving([PY, "manage.py", "devfleet", "--port", str(port), *args], env, port, log_path) as (url, proc):
        yield url, secret, proc


def _with_args(cmd: list[str], args: tuple[str, ...]) -> list[str]:
    """``cmd`` with ``args`` added as options: before waitress's app (its last, positional word), else at the end."""
    if not args:
        return cmd
    if Path(cmd[0]).name == "waitress-serve":
        return [*cmd[:-1], *args, cmd[-1]]
    return [*cmd, *args]


@contextlib.contextmanager
def celery_fleet(db_url: str, data_dir: Path, log_dir: Path, broker_url: str, extra_env: dict[str, str] | None = None,
                 processes: tuple[str, ...] = ("api", "worker", "beat"), port: int | None = None,
                 process_env: dict[str, dict[str, str]] | None = None, api: str = "waitress",
                 api_args: tuple[str, ...] = ()):
    """Run migrate, collectstatic, the API server, a Celery worker and Celery beat as README.md starts them.

    ``processes`` picks which of ``api``, ``worker``, ``beat`` to start, ``process_env``
    adds variables to one of them, ``api`` names the server (``"waitress"``, the README's
    production command, or ``"gunicorn"``, its alternative), ``api_args`` are flags appended to
    the API's command line (e.g. README.md's proxy flags); yields ``(url, secret, procs)``.
    """
    secret = uuid.uuid4().hex
    port = port or free_port()
    env = base_env(db_url, secret, data_dir, CELERY_BROKER_URL=broker_url, WORLDCELL_USE_CELERY="true",
                   **(extra_env or {}))
    subprocess.run([PY, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True)
    if "api" in processes:
        subprocess.run([PY, "manage.py", "collectstatic", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True)
    cmds = {
        "api": _with_args(readme_api_command(api, port), api_args),
        "worker": celery_command("worker", "worker", data_dir, concurrency=16, heartbeat=True)[0],
        "beat": celery_command("beat", "celerybeat", data_dir)[0],
    }
    procs = []
    logs = []
    try:
        for name, cmd in cmds.items():
            if name not in processes:
                continue
            log = open(log_dir / f"{name}.log", "ab")
            logs.append(log)
            own_env = {**env, **(process_env or {}).get(name, {})}
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env=own_env, stdout=log, stderr=subprocess.STDOUT))
        url = f"http://127.0.0.1:{port}"
        if "api" in processes:
            wait_healthy(url, procs)
        yield url, secret, procs
    finally:
        _stop(procs)
        for log in logs:
            log.close()
