"""Django settings for worldcell, read from the environment (django-environ).

Every knob is an environment variable; README.md has the table. Defaults give
the embedded fleet: a SQLite database under ``./data`` and no broker.
"""
import math
import os
from pathlib import Path
from urllib.parse import urlsplit

import environ
from django.core.exceptions import ImproperlyConfigured

from worldcell.startup import database_label

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()


def _number(name: str, default: float, *, whole: bool = False, minimum: float | None = None,
            above: float | None = None, maximum: float | None = None) -> float:
    """The environment variable ``name`` as a number (an int when ``whole``), ``default`` when unset or empty.

    Raises ImproperlyConfigured naming the variable and its value when it is not a finite
    number or lies outside ``minimum`` (inclusive), ``above`` (exclusive), ``maximum``;
    ``worldcell.startup`` turns that into the one-line configuration error (docs/operations.md "Processes").
    """
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw) if whole else float(raw)
    except ValueError:
        raise ImproperlyConfigured(
            f"{name}={raw!r} is not {'a whole number' if whole else 'a number'}") from None
    if not math.isfinite(value):
        raise ImproperlyConfigured(f"{name}={raw!r} is not a finite number")
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={raw!r} must be at least {minimum:g}")
    if above is not None and value <= above:
        raise ImproperlyConfigured(f"{name}={raw!r} must be greater than {above:g}")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name}={raw!r} must be at most {maximum:g}")
    return value


#: the DATABASE_URL schemes worldcell runs on (PostgreSQL or SQLite; django-environ's names)
_DB_SCHEMES = {"postgres", "postgresql", "psql", "pgsql", "sqlite"}


def _database(default: str) -> dict:
    """Django's ``DATABASES["default"]`` from ``DATABASE_URL``.

    Raises ImproperlyConfigured naming the variable and the value (without its password)
    when the scheme is not PostgreSQL or SQLite or the port is not a number in 1-65535.
    """
    url = os.environ.get("DATABASE_URL", "").strip() or default
    shown = database_label(url)
    try:
        parts = urlsplit(url)
        if parts.scheme != "sqlite":  # sqlite://:memory: has no port
            parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise ImproperlyConfigured(f"DATABASE_URL={shown!r} is not a usable database URL: {exc}") from None
    if parts.scheme not in _DB_SCHEMES:
        raise ImproperlyConfigured(
            f"DATABASE_URL={shown!r} is not a usable database URL: the scheme must be postgres:// or sqlite:///")
    if parts.scheme != "sqlite" and parts.port == 0:
        raise ImproperlyConfigured(f"DATABASE_URL={shown!r} is not a usable database URL: port 0")
    config = env.db_url_config(url)
    if not config.get("ENGINE") or (parts.scheme == "sqlite" and not config.get("NAME")):
        raise ImproperlyConfigured(f"DATABASE_URL={shown!r} is not a usable database URL")
    return config

DATA_DIR = Path(env.str("WORLDCELL_DATA_DIR", default=str(BASE_DIR / "data")))

SECRET_KEY = env.str("DJANGO_SECRET_KEY", default="worldcell-insecure-dev-key-change-me")
# Earlier values of DJANGO_SECRET_KEY, comma-separated: sessions and stored tenant secrets made
# under them stay valid while the key is rotated (worldcell/credentials.py).
SECRET_KEY_FALLBACKS = [k.strip() for k in env.list("DJANGO_SECRET_KEY_FALLBACKS", default=[]) if k.strip()]
DEBUG = env.bool("DJANGO_DEBUG", default=False)
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]", "testserver"])

# --- The world (docs/protocol.md §2.4, §7.2) -----------------------------------
# WORLD_SECRET unset or empty => every /v1/rpc route answers 503 WorldNotConfigured.
WORLD_SECRET = env.str("WORLD_SECRET", default="")
# The world-celld client release the default tenant's app speaks (docs/tenants.md); other tenants
# carry their own. Releases not served yet are refused here, at startup.
WORLDCELL_CLIENT_PROTOCOL = env.str("WORLDCELL_CLIENT_PROTOCOL", default="0.1").strip()
if WORLDCELL_CLIENT_PROTOCOL not in ("0.1",):
    raise ImproperlyConfigured(
        f"WORLDCELL_CLIENT_PROTOCOL={WORLDCELL_CLIENT_PROTOCOL!r} is not a client protocol this fleet serves "
        "(it serves: 0.1)")
WORKFLOW_CALLBACK_SECRET = env.str("WORKFLOW_CALLBACK_SECRET", default="")
# The QUEUE_* values keep their raw text: docs/protocol.md §7.2 parses them with
# JavaScript parseInt semantics at use time (queueing.config).
QUEUE_MAX_ATTEMPTS = env.str("QUEUE_MAX_ATTEMPTS", default="5")
QUEUE_MAX_INFLIGHT = env.str("QUEUE_MAX_INFLIGHT", default="5")
QUEUE_DELIVERY_TIMEOUT_MS = env.str("QUEUE_DELIVERY_TIMEOUT_MS", default="300000")
# A claim's lease: the delivering process renews it while the POST runs, so a
# dead worker's messages are due again within this many ms (docs/leases.md).
QUEUE_CLAIM_LEASE_MS = env.str("QUEUE_CLAIM_LEASE_MS", default="10000")
# A Celery worker's pump fires every due cell this often on its own, broker or
# not (wake-ups and beat poke it in between); queueing.tasks.
QUEUE_WORKER_TICK_MS = env.str("QUEUE_WORKER_TICK_MS", default="1000")

# --- Applications ---------------------------------------------------------
INSTALLED_APPS = [
    "worldcell.apps.ConsoleAdminConfig",  # django.contrib.admin with the console's AdminSite
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "ninja",
    "worldcell",
    "cells",
    "queueing",
]

MIDDLEWARE = [
    "worldcell.middleware.RpcFastPathMiddleware",
    "worldcell.middleware.CollapseSlashesMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # static files from the application itself, any WSGI server (docs/operations.md "Static files")
    "worldcell.staticfiles.StaticFilesMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
APPEND_SLASH = False

ROOT_URLCONF = "worldcell.urls"
WSGI_APPLICATION = "worldcell.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------
DATABASES = {"default": _database(default=f"sqlite:///{DATA_DIR / 'worldcell.sqlite3'}")}
_db = DATABASES["default"]
if _db["ENGINE"] == "django.db.backends.sqlite3":
    # WAL so readers never block the writer; IMMEDIATE so every transaction
    # takes the write lock up front (writers queue on busy_timeout instead of
    # failing with "database is locked" on lock upgrade). docs/architecture.md rule 1.
    _db.setdefault("OPTIONS", {}).update(
        {
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    )
    # Keep each thread's connection (opening one costs ~5 ms with the pragmas).
    _db["CONN_MAX_AGE"] = _number("DATABASE_CONN_MAX_AGE", 600, whole=True, minimum=0)
    # Tests use a file (not :memory:) so threads see one database.
    _db.setdefault("TEST", {})["NAME"] = str(DATA_DIR / "test-worldcell.sqlite3")
    if _db["NAME"] not in ("", ":memory:"):
        Path(_db["NAME"]).parent.mkdir(parents=True, exist_ok=True)
    DATA_DIR.mkdir(parents=True, exist_ok=True)
else:
    _db["CONN_MAX_AGE"] = _number("DATABASE_CONN_MAX_AGE", 600, whole=True, minimum=0)
    _db["CONN_HEALTH_CHECKS"] = True
    # Django's PostgreSQL backend, whose health check polls the socket instead of sending
    # SELECT 1 before each request's first query (worldcell/dbbackend/postgresql/base.py).
    if _db["ENGINE"] == "django.db.backends.postgresql":
        _db["ENGINE"] = "worldcell.dbbackend.postgresql"
    _db.setdefault("OPTIONS", {}).setdefault("application_name", "worldcell")

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
IS_SQLITE = _db["ENGINE"] == "django.db.backends.sqlite3"

# --- Celery -----------------------------------------------------------------
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default="redis://127.0.0.1:6379/0")
CELERY_TASK_ACKS_LATE = False
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_WORKER_PREFETCH_MULTIPLIER = 4
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Ride out a broker outage of any length (the default gives up after 100
# attempts); deliveries go on meanwhile (docs/operations-faults.md).
CELERY_BROKER_CONNECTION_RETRY = True
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_TIMEZONE = "UTC"
CELERY_BEAT_SCHEDULE = {
    "fire-due-alarms": {
        "task": "queueing.tasks.fire_due_alarms",
        "schedule": 1.0,
        "options": {"expires": 5},
    },
}
# --- Run lifecycle: retention and stuck-run repair (docs/lifecycle.md) -----------
# Both retention policies are off unless set; a value that does not parse stops
# the fleet here (ImproperlyConfigured), it never falls back silently.
from django.core.exceptions import ImproperlyConfigured  # noqa: E402

from worldcell.durations import parse_duration_ms  # noqa: E402

WORLDCELL_RUN_RETENTION_MS = parse_duration_ms(env.str("WORLDCELL_RUN_RETENTION", default=""), "WORLDCELL_RUN_RETENTION")
WORLDCELL_MAX_RUN_AGE_MS = parse_duration_ms(env.str("WORLDCELL_MAX_RUN_AGE", default=""), "WORLDCELL_MAX_RUN_AGE")
try:
    WORLDCELL_RETENTION_BATCH = int(env.str("WORLDCELL_RETENTION_BATCH", default="128"))
except ValueError:
    raise ImproperlyConfigured("WORLDCELL_RETENTION_BATCH must be an integer from 1 to 1000") from None
if not 1 <= WORLDCELL_RETENTION_BATCH <= 1000:
    raise ImproperlyConfigured("WORLDCELL_RETENTION_BATCH must be an integer from 1 to 1000")
# The share of wall time a sweep may work (0 < duty <= 1); it pauses between pages for the rest.
try:
    WORLDCELL_RETENTION_DUTY = float(env.str("WORLDCELL_RETENTION_DUTY", default="0.5"))
except ValueError:
    raise ImproperlyConfigured("WORLDCELL_RETENTION_DUTY must be a number above 0 and at most 1") from None
if not 0 < WORLDCELL_RETENTION_DUTY <= 1:
    raise ImproperlyConfigured("WORLDCELL_RETENTION_DUTY must be a number above 0 and at most 1")
# Milliseconds between a run's tombstone and its final "settle" cleanup pass (late in-flight writes).
WORLDCELL_RETENTION_SETTLE_MS = env.int("WORLDCELL_RETENTION_SETTLE_MS", default=60_000)
# A run idle (no new event) this long with nothing queued to resume it is re-enqueued; "off" disables.
WORLDCELL_STUCK_RUN_AFTER_MS = parse_duration_ms(
    env.str("WORLDCELL_STUCK_RUN_AFTER", default="15m"), "WORLDCELL_STUCK_RUN_AFTER"
)
# Seconds between lifecycle sweeps (beat and the dev fleet's ticker).
WORLDCELL_LIFECYCLE_INTERVAL_S = env.float("WORLDCELL_LIFECYCLE_INTERVAL_S", default=30.0)
CELERY_BEAT_SCHEDULE["lifecycle-sweep"] = {
    "task": "cells.tasks.lifecycle_sweep",
    "schedule": WORLDCELL_LIFECYCLE_INTERVAL_S,
    "options": {"expires": max(5.0, WORLDCELL_LIFECYCLE_INTERVAL_S)},
}

# When false (the embedded dev fleet, tests without a broker) nothing is sent
# to Celery: an in-process pump drives the same services.
WORLDCELL_USE_CELERY = env.bool("WORLDCELL_USE_CELERY", default=not IS_SQLITE)

# Serve /v1/health and /v1/rpc straight from worldcell.rpc.handle, skipping the
# admin's middleware and ninja's operation layer (same answers, less CPU).
WORLDCELL_RPC_FAST_PATH = env.bool("WORLDCELL_RPC_FAST_PATH", default=True)

# --- Request bodies -----------------------------------------------------------
# The RPC route enforces its own 32 MiB cap while streaming (docs/protocol.md §2.2).
DATA_UPLOAD_MAX_MEMORY_SIZE = None
RPC_MAX_BODY_BYTES = 33_554_432

# --- Misc ---------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

# --- Static files (docs/operations.md "Static files") ------------------------
# whitenoise serves them from the application under any WSGI server. ``manage.py
# collectstatic`` (devfleet runs it at start) writes compressed copies with
# content-hashed names into STATIC_ROOT, cached for a year; without it the
# files are served unhashed from the apps themselves (WHITENOISE_USE_FINDERS).
STATIC_URL = "static/"
STATIC_ROOT = Path(env.str("WORLDCELL_STATIC_ROOT", default=str(DATA_DIR / "static")))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "worldcell.staticfiles.StaticStorage"},
}
WHITENOISE_USE_FINDERS = True

# --- Behind a reverse proxy (docs/operations.md "Behind a proxy") --------------
CSRF_TRUSTED_ORIGINS = env.list("DJANGO_CSRF_TRUSTED_ORIGINS", default=[])
# Opt-in: trust X-Forwarded-Proto only when a proxy you run always sets it.
if env.bool("DJANGO_SECURE_PROXY_SSL_HEADER", default=False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
USE_X_FORWARDED_HOST = env.bool("DJANGO_USE_X_FORWARDED_HOST", default=False)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = env.bool("DJANGO_SECURE_COOKIES", default=False)
SECURE_HSTS_SECONDS = _number("DJANGO_SECURE_HSTS_SECONDS", 0, whole=True, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", default=False)
SECURE_HSTS_PRELOAD = env.bool("DJANGO_SECURE_HSTS_PRELOAD", default=False)
SECURE_SSL_REDIRECT = env.bool("DJANGO_SECURE_SSL_REDIRECT", default=False)
# probes and scrapers talk plain HTTP to the instance itself
SECURE_REDIRECT_EXEMPT = [r"^healthz/", r"^metrics$"]

# --- Health and metrics (docs/operations.md "Health", "Metrics") -------------
# Readiness fails when beat's last tick (recorded by fire_due_alarms) is older
# than this, or when the most overdue queue alarm is older than the other.
HEALTH_BEAT_MAX_AGE_S = _number("HEALTH_BEAT_MAX_AGE_S", 15.0, above=0)
HEALTH_ALARM_MAX_OVERDUE_S = _number("HEALTH_ALARM_MAX_OVERDUE_S", 60.0, above=0)
HEALTH_CHECK_TIMEOUT_S = _number("HEALTH_CHECK_TIMEOUT_S", 2.0, above=0, maximum=300)
# readiness results are shared for this long (worldcell.health.readiness: one run at a time)
HEALTH_CACHE_S = _number("HEALTH_CACHE_S", 1.0, minimum=0, maximum=300)
# /metrics: on unless false; a bearer token, when set, is required to scrape.
METRICS_ENABLED = env.bool("WORLDCELL_METRICS", default=True)
METRICS_TOKEN = env.str("METRICS_TOKEN", default="")
METRICS_COUNT_CAP = _number("METRICS_COUNT_CAP", 100_000, whole=True, minimum=1)
# bounded label sets: queue names labelled by themselves per process, shards shown by name
METRICS_QUEUE_NAMES = _number("METRICS_QUEUE_NAMES", 100, whole=True, minimum=0, maximum=10_000)
METRICS_SHARDS = _number("METRICS_SHARDS", 100, whole=True, minimum=1, maximum=10_000)
# a Celery worker serves its own delivery metrics here (0 = off)
WORKER_METRICS_PORT = _number("WORLDCELL_WORKER_METRICS_PORT", 0, whole=True, minimum=0, maximum=65535)
WORKER_METRICS_HOST = env.str("WORLDCELL_WORKER_METRICS_HOST", default="127.0.0.1")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env.str("WORLDCELL_LOG_LEVEL", default="INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        "httpx": {"level": "WARNING"},  # queueing logs one line per delivery itself
        "httpcore": {"level": "WARNING"},
    },
}
