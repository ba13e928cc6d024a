"""WSGI entry points.

* ``application`` — the Django WSGI app (gunicorn ``worldcell.wsgi:application``, the dev
  fleet's in-process waitress). Created on first access (PEP 562 module ``__getattr__``), so
  importing this module loads no settings: a bad configuration is reported by the check below
  as one line, not as a traceback from the import.
* ``checked_application()`` — a factory for the production API command
  (``waitress-serve --call worldcell.wsgi:checked_application``): it first runs the
  configuration check of ``worldcell.startup`` (one line on stderr and exit status 2 when,
  e.g., ``DATABASE_URL`` is malformed or names a missing database or ``WORLD_SECRET`` is unset;
  docs/operations.md "Processes"), then returns ``application``. gunicorn runs the same
  check from ``worldcell/gunicorn_conf.py``.
"""
import os
import threading

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "worldcell.settings")

_lock = threading.Lock()
_application = None


def _get_application():
    global _application
    with _lock:
        if _application is None:
            from django.core.wsgi import get_wsgi_application

            _application = get_wsgi_application()
    return _application


def __getattr__(name: str):
    if name == "application":
        return _get_application()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def checked_application():
    """The production API's app, after ``worldcell.startup.exit_if_misconfigured("api")``."""
    from worldcell.startup import exit_if_misconfigured

    exit_if_misconfigured("api")
    return _get_application()
