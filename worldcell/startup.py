"""Configuration checks at process start: one clear line and a non-zero exit (docs/operations.md "Processes").

``check(role)`` loads the settings and connects to the database; for the API
(``role="api"``) it also requires ``WORLD_SECRET`` or a live stored tenant secret. It returns None or the
error text. ``exit_if_misconfigured(role)`` prints that text as ONE line on
stderr (``worldcell api: configuration error: …``) and exits with status 2
(``EXIT_CONFIG``), so systemd's ``Restart=always`` and its journal show why
the service keeps failing instead of a traceback.

Called from ``worldcell/gunicorn_conf.py`` (the API master, before any worker
starts), from the Celery worker's and beat's init signals (``worldcell.celery``)
and from ``manage.py`` for a database that cannot be opened.
"""
from __future__ import annotations

import os
import sys
from urllib.parse import urlsplit

EXIT_CONFIG = 2

__all__ = ["EXIT_CONFIG", "beat_schedule_problem", "check", "check_settings", "database_label",
           "describe_database_error", "exit_if_beat_schedule_unusable", "exit_if_misconfigured",
           "exit_if_settings_invalid"]


def database_label(url: str) -> str:
    """``url`` without credentials: ``postgres://host:port/name`` or the SQLite path; never raises."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc.rpartition("@")[2]  # the host and the port as written, even when invalid
        return f"{parts.scheme}://{netloc}{parts.path}" if parts.scheme else netloc + parts.path
    except ValueError:
        return "<unparsable URL>"


def _database_label() -> str:
    url = os.environ.get("DATABASE_URL", "")
    return database_label(url) if url else "the default SQLite file"


def describe_database_error(exc: BaseException) -> str:
    """One line for a failure to open the database: the server's reason, never a password."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    # psycopg: 'connection failed: connection to server at "…", port … failed: FATAL:  database "x" does not exist'
    if "FATAL:" in text:
        text = text.split("FATAL:", 1)[1].strip()
    elif "failed:" in text:
        text = text.rsplit("failed:", 1)[1].strip() or text
    hint = ""
    if "does not exist" in text and "database" in text:
        hint = " (create it: createdb, see README.md \"Production: PostgreSQL + waitress + Celery\")"
    return f"cannot open the database {_database_label()} (DATABASE_URL): {text[:300]}{hint}"


def check_settings() -> str | None:
    """Load (and so validate) the settings module; its error as one line, or None."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "worldcell.settings")
    try:
        # the settings only, not django.setup(): in Celery beat that would re-apply LOGGING over
        # Celery's own handlers, and beat's log lines would vanish
        from django.conf import settings

        settings.WORLD_SECRET  # noqa: B018 - loads (and validates) the settings module
    except Exception as exc:  # noqa: BLE001 - a settings error is a configuration error
        return f"the settings cannot be loaded: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    return None


def check(role: str) -> str | None:
    """Load the settings and open the database; the first problem found as one line, or None.

    ``role``: ``"api"``, ``"worker"`` or ``"beat"`` (only the API needs a credential: ``WORLD_SECRET`` or a stored tenant secret).
    """
    problem = check_settings()
    if problem is not None:
        return problem
    from django.conf import settings

    from django.db import connections

    try:
        conn = connections["default"]
        conn.ensure_connection()
        stored = role == "api" and not settings.WORLD_SECRET and _has_stored_secret(conn)
        conn.close()
    except Exception as exc:  # noqa: BLE001 - any failure to connect is reported the same way
        return describe_database_error(exc)
    if role == "api" and not settings.WORLD_SECRET and not stored:
        return ("WORLD_SECRET is not set and no tenant has a live secret: every RPC call would answer 503 "
                "WorldNotConfigured (set it to the Node app's CELLD_WORLD_SECRET, or manage.py tenant secret add)")
    return None


def _has_stored_secret(conn) -> bool:
    """Whether a live tenant secret hashed under a key this process knows is stored (docs/tenants.md).

    Plain DB-API SQL: the apps need not be loaded yet, and Django's "database access during app
    initialization" warning would break the one-line rule.
    """
    from datetime import datetime, timezone

    from . import credentials

    ids = credentials.known_key_ids()
    marks = ", ".join(["%s"] * len(ids)) if conn.vendor == "postgresql" else ", ".join(["?"] * len(ids))
    mark = "%s" if conn.vendor == "postgresql" else "?"
    now = datetime.now(timezone.utc)
    cursor = conn.connection.cursor()
    try:
        cursor.execute(
            "SELECT 1 FROM worldcell_tenantsecret s JOIN worldcell_tenant t ON t.id = s.tenant_id "
            f"WHERE s.revoked_at IS NULL AND NOT t.disabled AND s.key_id IN ({marks}) "
            f"AND (s.expires_at IS NULL OR s.expires_at > {mark}) LIMIT 1",
            [*ids, now if conn.vendor == "postgresql" else now.strftime("%Y-%m-%d %H:%M:%S.%f")])
        return cursor.fetchone() is not None
    except Exception:  # noqa: BLE001 - not migrated yet (no such table): no stored secrets
        return False
    finally:
        cursor.close()


def exit_if_misconfigured(role: str) -> None:
    """Run ``check(role)``; on a problem print one line on stderr and exit with ``EXIT_CONFIG``."""
    _exit_on(role, check(role))


def exit_if_settings_invalid(role: str) -> None:
    """Run ``check_settings()`` (no database connection); on a problem, one line and ``EXIT_CONFIG``.

    For processes that load the settings before their own check can run (``manage.py``,
    ``celery -A worldcell``).
    """
    _exit_on(role, check_settings())


def beat_schedule_problem(argv: list[str]) -> str | None:
    """The problem with beat's schedule file named in ``argv`` (``--schedule X``, ``--schedule=X``,
    ``-s X``, ``-sX``), or None when its folder exists and is writable or no file is named.

    Celery opens the file before any of its signals fire, so a missing folder would otherwise
    end beat with a shelve traceback (docs/operations.md "Processes").
    """
    path = None
    for i, arg in enumerate(argv):
        if arg in ("--schedule", "-s") and i + 1 < len(argv):
            path = argv[i + 1]
        elif arg.startswith("--schedule="):
            path = arg.split("=", 1)[1]
        elif arg.startswith("-s") and len(arg) > 2 and not arg.startswith("--"):
            path = arg[2:]
    if not path:
        return None
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"beat's schedule folder {folder} does not exist (--schedule {path}); create it, e.g. mkdir -p {folder}"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"beat's schedule folder {folder} is not writable by this user (--schedule {path})"
    return None


def exit_if_beat_schedule_unusable(argv: list[str]) -> None:
    """``beat_schedule_problem(argv)``; on a problem, one line and ``EXIT_CONFIG``."""
    _exit_on("beat", beat_schedule_problem(argv))


def _exit_on(role: str, problem: str | None) -> None:
    if problem is None:
        return
    line = f"worldcell {role}: configuration error: {problem}\n"
    # straight to file descriptor 2: Celery replaces sys.stderr with a logging proxy
    try:
        sys.stderr.flush()
    except Exception:  # noqa: BLE001
        pass
    os.write(2, line.encode("utf-8", "replace"))
    os._exit(EXIT_CONFIG)  # not SystemExit: gunicorn and Celery would wrap it in their own tracebacks
