"""The API, worker, beat and manage.py exit non-zero with ONE clear line on a bad configuration
(issue 12 parts 6-7, docs/operations.md "Processes")."""
from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest
from django.conf import settings

from tests.e2e.fleet_processes import PY, ROOT, base_env, free_port
from tests.services import test_database_url

pytestmark = [pytest.mark.postgres_only, pytest.mark.slow]  # slow: starts fleet processes

BIN = Path(PY).parent


def _missing_db_url() -> str:
    db = settings.DATABASES["default"]
    return (f"postgres://{db['USER'] or 'postgres'}:hunter2@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}"
            f"/worldcell_missing_{uuid.uuid4().hex[:6]}")


def _run(cmd: list[str], env: dict[str, str], tmp_path: Path) -> tuple[int, list[str]]:
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if "configuration error" in line
             or line.startswith("worldcell:")]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return proc.returncode, lines


COMMANDS = {
    "migrate": [PY, "manage.py", "migrate", "--noinput"],
    "devfleet": [PY, "manage.py", "devfleet", "--port", "0"],
    "api": [str(BIN / "waitress-serve"), "--listen", "127.0.0.1:0", "--call", "worldcell.wsgi:checked_application"],
    "api-gunicorn": [str(BIN / "gunicorn"), "-c", "python:worldcell.gunicorn_conf", "--bind", "127.0.0.1:0",
                     "worldcell.wsgi:application"],
    "worker": [str(BIN / "celery"), "-A", "worldcell", "worker", "--pool", "threads", "--concurrency", "2"],
    "beat": [str(BIN / "celery"), "-A", "worldcell", "beat"],
}


@pytest.mark.parametrize("process", list(COMMANDS))
def test_a_missing_database_is_one_line_and_exit_2(process, tmp_path):
    url = _missing_db_url()
    name = url.rsplit("/", 1)[1]
    env = base_env(url, "a-secret", tmp_path, CELERY_BROKER_URL="redis://127.0.0.1:1/0")
    cmd = COMMANDS[process] + (["--schedule", str(tmp_path / "beat-schedule")] if process == "beat" else [])
    rc, lines = _run(cmd, env, tmp_path)
    assert rc == 2
    assert len(lines) == 1, lines
    assert f'database "{name}" does not exist' in lines[0] and "DATABASE_URL" in lines[0]
    assert "hunter2" not in lines[0]


@pytest.mark.django_db  # the test database, migrated: the check looks for stored tenant secrets there
@pytest.mark.parametrize("process", ["api", "api-gunicorn"])
def test_the_api_refuses_to_start_without_world_secret(process, tmp_path):
    env = base_env(test_database_url(), "", tmp_path)
    cmd = [f"127.0.0.1:{free_port()}" if arg == "127.0.0.1:0" else arg for arg in COMMANDS[process]]
    rc, lines = _run(cmd, env, tmp_path)
    assert rc == 2 and len(lines) == 1 and "WORLD_SECRET is not set" in lines[0]


def test_an_unreadable_setting_is_one_line(tmp_path):
    env = base_env(_missing_db_url(), "a-secret", tmp_path, DJANGO_SECURE_HSTS_SECONDS="soon")
    rc, lines = _run(COMMANDS["api"], env, tmp_path)
    assert rc == 2 and len(lines) == 1 and "settings cannot be loaded" in lines[0] and "'soon'" in lines[0]


#: malformed values: (variable, value, text the one line must contain)
MALFORMED = {
    "unknown-scheme": ("DATABASE_URL", "foo://bar", "DATABASE_URL='foo://bar'"),
    "not-a-url": ("DATABASE_URL", "::::", "DATABASE_URL='::::'"),
    "port-out-of-range": ("DATABASE_URL", "postgres://ops:hunter2@127.0.0.1:99999/db",
                          "DATABASE_URL='postgres://127.0.0.1:99999/db'"),
    "timeout-not-a-number": ("HEALTH_CHECK_TIMEOUT_S", "abc", "HEALTH_CHECK_TIMEOUT_S='abc' is not a number"),
    "timeout-zero": ("HEALTH_CHECK_TIMEOUT_S", "0", "HEALTH_CHECK_TIMEOUT_S='0' must be greater than 0"),
    "beat-age-negative": ("HEALTH_BEAT_MAX_AGE_S", "-5", "HEALTH_BEAT_MAX_AGE_S='-5' must be greater than 0"),
    "metrics-port": ("WORLDCELL_WORKER_METRICS_PORT", "70000", "WORLDCELL_WORKER_METRICS_PORT='70000' must be at most"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
@pytest.mark.parametrize("process", list(COMMANDS))
def test_a_malformed_setting_is_one_line_naming_it_and_exit_2(process, case, tmp_path):
    name, value, expected = MALFORMED[case]
    db = settings.DATABASES["default"]
    good_url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    env = base_env(good_url, "a-secret", tmp_path, CELERY_BROKER_URL="redis://127.0.0.1:1/0")
    env[name] = value
    cmd = COMMANDS[process] + (["--schedule", str(tmp_path / "beat-schedule")] if process == "beat" else [])
    rc, lines = _run(cmd, env, tmp_path)
    assert rc == 2
    assert len(lines) == 1, lines
    assert "configuration error" in lines[0] and expected in lines[0], lines[0]
    assert "hunter2" not in lines[0]


@pytest.mark.parametrize("spelling", ["--schedule {}", "--schedule={}", "-s {}"])
def test_beat_with_a_missing_schedule_folder_is_one_line_and_exit_2(spelling, tmp_path):
    db = settings.DATABASES["default"]
    env = base_env(f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}", "a-secret", tmp_path)
    missing = tmp_path / "no-such-folder" / "celerybeat-schedule"
    rc, lines = _run(COMMANDS["beat"] + spelling.format(missing).split(" "), env, tmp_path)
    assert rc == 2
    assert len(lines) == 1, lines
    assert f"{missing.parent} does not exist" in lines[0] and "mkdir -p" in lines[0]
