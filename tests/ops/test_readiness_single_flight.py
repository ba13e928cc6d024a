"""Anonymous readiness probes cannot starve the API (docs/operations.md "Health").

waitress as README.md starts it (8 threads), Celery as the driver, and as ``CELERY_BROKER_URL``
a private TCP server that accepts connections and never answers: each run of the checks takes
the whole ``HEALTH_CHECK_TIMEOUT_S``. 40 concurrent probes must cost about one run, and an RPC
sent while they are in flight must not queue behind them.
"""
from __future__ import annotations

import contextlib
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.e2e.fleet_processes import celery_fleet
from tests.ops.support import fresh_database
from worldcell import codec

pytestmark = [pytest.mark.any_database, pytest.mark.slow, pytest.mark.timeout(180)]

TIMEOUT_S = 3.0
PROBES = 40


@contextlib.contextmanager
def silent_server():
    """A TCP server on 127.0.0.1 that accepts every connection and never sends a byte; yields its port."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(256)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        t.join(5)
        for s in held:
            s.close()
        srv.close()


def _wave(url: str, secret: str) -> tuple[float, float, list[int]]:
    """40 concurrent probes and, 0.3 s in, one RPC; ``(s until every probe answered, RPC s, statuses)``."""
    def probe(_):
        return httpx.get(f"{url}/healthz/ready", timeout=60).status_code

    started = time.monotonic()
    with ThreadPoolExecutor(PROBES) as pool:
        futures = [pool.submit(probe, i) for i in range(PROBES)]
        time.sleep(0.3)
        t0 = time.monotonic()
        rpc = httpx.post(f"{url}/v1/rpc/queue/q%3A0/stats", content=codec.encode([]),
                         headers={"Authorization": f"Bearer {secret}"}, timeout=60)
        rpc_s = time.monotonic() - t0
        statuses = [f.result() for f in futures]
    assert rpc.status_code == 200, rpc.text
    return time.monotonic() - started, rpc_s, statuses


def test_concurrent_probes_with_a_hung_broker_cost_one_check(tmp_path):
    with silent_server() as port, fresh_database(tmp_path) as db_url:
        env = {"HEALTH_CHECK_TIMEOUT_S": str(TIMEOUT_S)}
        with celery_fleet(db_url, tmp_path, tmp_path, f"redis://127.0.0.1:{port}/0", extra_env=env,
                          processes=("api",)) as (url, secret, _):
            # a cold start: no earlier result, the probes wait for the one run in progress
            total_s, rpc_s, statuses = _wave(url, secret)
            assert statuses == [503] * PROBES
            # one-by-one on 8 threads this took 40 / 8 × 3 s = 15 s, and the RPC waited behind it
            assert total_s < 2 * TIMEOUT_S, total_s
            assert rpc_s < TIMEOUT_S + 1.0, rpc_s
            # later waves find the previous result: only one probe waits for the new run
            time.sleep(1.5)
            total_s, rpc_s, statuses = _wave(url, secret)
            assert statuses == [503] * PROBES
            assert total_s < TIMEOUT_S + 1.5, total_s
            assert rpc_s < 1.0, rpc_s
