"""The dev fleet's pump renews claim leases too (docs/leases.md): kill -9 of ``manage.py devfleet``
mid-delivery, start it again, and the message is redelivered within one lease (default settings),
not after the protocol's 330 s deadline (docs/protocol.md §7.4)."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from .support import Answer, HttpSink, enqueue_request
from tests.e2e.fleet_processes import dev_fleet
from worldcell_client import WorldClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def test_a_killed_dev_fleets_in_flight_message_is_redelivered_within_15_seconds_of_its_restart(tmp_path):
    held = threading.Event()
    posts: list[float] = []

    def script(rec):
        posts.append(time.time())
        if len(posts) == 1:
            held.wait(60)  # the first POST never gets an answer to its fleet
        return Answer(200)

    sink = HttpSink()
    sink.script(script)
    db_url = f"sqlite:///{tmp_path / 'fleet.sqlite3'}"
    env = {k: v for k, v in os.environ.items() if k.startswith("QUEUE_")}
    for k in env:
        os.environ.pop(k)  # default lease settings in the fleet
    try:
        with dev_fleet(db_url, tmp_path, tmp_path / "devfleet-1.log") as (url, secret, proc):
            client = WorldClient(url, secret)
            assert client.call("queue", "q:0", "enqueue", enqueue_request(messageId="m", target=sink.url))["ok"]
            assert sink.wait_for(1, 15)
            killed_at = time.time()
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
        with dev_fleet(db_url, tmp_path, tmp_path / "devfleet-2.log") as (url, secret, proc):
            assert sink.wait_for(2, 30), (tmp_path / "devfleet-2.log").read_text()[-2000:]
            redelivered_s = posts[1] - killed_at
            print(f"\n[devfleet kill -9] redelivered {redelivered_s:.1f} s after the kill (restart included)")
            assert redelivered_s < 15
            assert [r.attempt for r in sink.requests] == ["1", "1"]
            client = WorldClient(url, secret)
            deadline = time.monotonic() + 10
            while client.call("queue", "q:0", "stats")["inflight"] and time.monotonic() < deadline:
                time.sleep(0.1)
            assert client.call("queue", "q:0", "stats") == {"pending": 0, "inflight": 0, "deadLetters": 0,
                                                           "alarmAt": None}
    finally:
        held.set()
        sink.close()
        os.environ.update(env)
