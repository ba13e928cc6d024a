"""gunicorn settings for the API (``gunicorn -c python:worldcell.gunicorn_conf worldcell.wsgi:application``).

Command-line flags still override these. What it adds: the master checks the
configuration first (``worldcell.startup``: one line and exit status 2 when, e.g.,
``DATABASE_URL`` names a database that does not exist or ``WORLD_SECRET`` is unset);
and (docs/operations.md "Metrics") with ``PROMETHEUS_MULTIPROC_DIR`` set, the master empties that directory when it
starts (values of a previous run would otherwise be added in again) and marks each
exited worker dead so its live gauges stop counting; counters of dead workers stay
in the totals, as Prometheus expects of a counter.
"""
import os

if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    # imported here, not in child_exit: that hook runs from the SIGCHLD handler, where an import
    # interrupted by the next SIGCHLD fails half-initialised
    from prometheus_client import multiprocess
else:
    multiprocess = None

worker_class = "gthread"
workers = int(os.environ.get("WEB_CONCURRENCY", "3"))
threads = int(os.environ.get("GUNICORN_THREADS", "8"))
timeout = 120
bind = os.environ.get("WORLDCELL_BIND", "127.0.0.1:8787")


def on_starting(server):
    # a bad configuration is one line and exit status 2, before any worker starts (worldcell.startup)
    from worldcell.startup import exit_if_misconfigured

    exit_if_misconfigured("api")
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if path:
        os.makedirs(path, exist_ok=True)
        for name in os.listdir(path):
            if name.endswith(".db"):
                os.unlink(os.path.join(path, name))


def child_exit(server, worker):
    if multiprocess is not None:
        multiprocess.mark_process_dead(worker.pid)
