"""Metrics across processes (docs/operations.md "Metrics"): gunicorn's workers add up in
multiprocess mode, and a Celery worker serves its delivery metrics on its own port."""
from __future__ import annotations

import json
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.queueing.support import HttpSink, enqueue_request
from tests.e2e.fleet_processes import celery_fleet, free_port
from tests.ops.support import fresh_database

pytestmark = [pytest.mark.slow, pytest.mark.postgres_only]

WORKER_METRICS_PORT = free_port()  # chosen once per test session


def _value(text: str, name: str, **labels) -> float:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


def test_gunicorn_workers_add_up_and_the_celery_worker_serves_its_own(tmp_path, broker_url):
    # as the shipped systemd units: the API (gunicorn) in multiprocess mode with a directory of its
    # own; the worker (threads pool, one process) serves its own metrics on a port
    per_process = {"api": {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "prom")},
                   "worker": {"WORLDCELL_WORKER_METRICS_PORT": str(WORKER_METRICS_PORT)}}
    sink = HttpSink()
    try:
        with fresh_database(tmp_path) as db_url:
            with celery_fleet(db_url, tmp_path, tmp_path, broker_url, process_env=per_process, api="gunicorn") as (url, secret, _):
                before = httpx.get(f"{url}/metrics", timeout=10).text
                for _ in range(40):  # a new connection each: gunicorn spreads them over its 2 workers
                    resp = httpx.get(f"{url}/v1/health", timeout=10)
                    assert resp.status_code == 200
                n0 = _value(before, "worldcell_rpc_requests_total", binding="health", status="200")
                for _ in range(4):
                    text = httpx.get(f"{url}/metrics", timeout=10).text
                    assert _value(text, "worldcell_rpc_requests_total", binding="health", status="200") - n0 == 40
                files = sorted(p.name for p in (tmp_path / "prom").iterdir())
                pids = {name.rsplit("_", 1)[-1] for name in files if name.startswith("counter_")}
                assert len(pids) >= 2, files  # both gunicorn workers wrote values

                req = enqueue_request(messageId="m-metrics", target=sink.url, queueName="__wkf_step_proc")
                resp = httpx.post(f"{url}/v1/rpc/queue/q:0/enqueue", content=json.dumps([req]),
                                  headers={"Authorization": f"Bearer {secret}"}, timeout=10)
                assert resp.status_code == 200 and resp.json()["ok"] is True, resp.text
                deadline = time.monotonic() + 20
                delivered = 0.0
                while time.monotonic() < deadline and not delivered:
                    try:
                        text = httpx.get(f"http://127.0.0.1:{WORKER_METRICS_PORT}/metrics", timeout=2).text
                        delivered = _value(text, "worldcell_queue_deliveries_total", queue="__wkf_step_proc",
                                           outcome="delivered")
                    except httpx.HTTPError:
                        pass
                    time.sleep(0.2)
                assert delivered == 1
                api = httpx.get(f"{url}/metrics", timeout=10).text
                assert _value(api, "worldcell_queue_enqueued_total", queue="__wkf_step_proc") == 1
                assert _value(api, "worldcell_queue_deliveries_total", queue="__wkf_step_proc", outcome="delivered") == 0
    finally:
        sink.close()
