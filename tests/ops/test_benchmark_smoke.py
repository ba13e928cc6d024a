"""The benchmark command runs end to end on a tiny workload (no timing assertions)."""
import json

import pytest
from django.core.management import call_command

from tests.e2e.fleet_processes import dev_fleet

pytestmark = pytest.mark.slow


def test_it_measures_every_workload_and_checks_queue_integrity(tmp_path):
    out = tmp_path / "bench.json"
    with dev_fleet(f"sqlite:///{tmp_path / 'fleet.sqlite3'}", tmp_path, tmp_path / "fleet.log") as (url, secret, _):
        call_command(
            "benchmark", url=url, secret=secret, json=str(out), messages=40, clients=4, shards=2,
            runs=4, event_clients=2, steps=2, population=60, list_samples=3, chunks=70,
        )
    figures = json.loads(out.read_text())
    q = figures["queue"]
    assert q["integrity"]["ok"] is True
    assert q["integrity"]["delivered"] == 40 and q["integrity"]["duplicate_successes"] == 0
    assert q["latency_retried"]["n"] == 2  # seq 0 and 20 were answered 503 once
    assert figures["events"]["failed_runs"] == 0
    assert figures["events"]["rpcs"] >= 4 * (2 + 2 * 3 + 1)
    assert set(figures["listing"]["pages"]["workflowName"]) == {"first", "middle", "last"}
    assert figures["streams"]["chunks"] == 70 and figures["streams"]["writes_per_s"] > 0
