"""``/metrics`` (docs/operations.md "Metrics"): recorded RPC and queue metrics, scrape-time gauges, the token."""
from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from queueing.models import DeadLetter, Message
from queueing.service import QueueCell
from tests.queueing.support import Answer, VirtualClock, enqueue_request, sink, tick  # noqa: F401  (sink: a fixture)

pytestmark = pytest.mark.django_db(transaction=True)


def scrape(client, **headers) -> dict[tuple[str, tuple], float]:
    resp = client.get("/metrics", **headers)
    assert resp.status_code == 200, resp.content
    assert resp["Content-Type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(resp.content.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples, name, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture(autouse=True)
def no_broker(settings):
    settings.WORLDCELL_USE_CELERY = False


@pytest.fixture(autouse=True)
def fresh_queue_labels():
    """Each test starts with no queue names seen (the label set is per process)."""
    from worldcell import metrics

    metrics.reset_queue_labels()
    yield
    metrics.reset_queue_labels()




def test_rpc_requests_are_counted_by_binding_method_and_status(client, rpc):
    before = scrape(client)
    rpc.ok("queue", "q:0", "stats")
    rpc.ok("queue", "q:0", "stats")
    assert rpc("queue", "q:0", "nope")[0] == 404
    assert rpc("nonsense", "x", "y")[0] == 404
    client.get("/v1/health")
    after = scrape(client)

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("worldcell_rpc_requests_total", binding="queue", method="stats", status="200") == 2
    assert delta("worldcell_rpc_requests_total", binding="queue", method="other", status="404") == 1
    assert delta("worldcell_rpc_requests_total", binding="other", method="other", status="404") == 1
    assert delta("worldcell_rpc_requests_total", binding="health", method="health", status="200") == 1
    assert delta("worldcell_rpc_request_duration_seconds_count", binding="queue", method="stats") == 2
    assert value(after, "worldcell_build_info", version="0.1.0", python=__import__("platform").python_version(),
                 django=__import__("django").get_version()) == 1


def test_queue_outcomes_latency_and_gauges(client, settings, sink):
    settings.QUEUE_MAX_ATTEMPTS = "2"
    clock = VirtualClock().install()
    try:
        before = scrape(client)
        cell = QueueCell("q:0")
        answers = {"m-ok": Answer(200), "m-drop": Answer(410), "m-later": Answer(503, {"timeoutSeconds": 30}),
                   "m-fail": Answer(500)}
        sink.script(lambda rec: answers.get(rec.headers["x-vqs-message-id"], Answer(500)))
        for mid in answers:
            assert cell.enqueue(enqueue_request(messageId=mid, target=sink.url, queueName="__wkf_step_metrics"))["ok"]
        dup = enqueue_request(messageId="m-dup", target=sink.url, queueName="__wkf_step_metrics", idempotencyKey="k")
        cell.enqueue(dup)
        cell.enqueue({**dup, "messageId": "m-dup2"})  # deduplicated by the live key
        clock.advance(250)
        tick(clock, 10)  # first attempts: 200, 410, 503 + timeoutSeconds, 500 and 500 (m-dup)
        mid = scrape(client)
        q = "__wkf_step_metrics"

        def delta(samples, name, **labels):
            return value(samples, name, **labels) - value(before, name, **labels)

        assert delta(mid, "worldcell_queue_enqueued_total", queue=q) == 5
        assert delta(mid, "worldcell_queue_deduped_total", queue=q) == 1
        assert delta(mid, "worldcell_queue_deliveries_total", queue=q, outcome="delivered") == 1
        assert delta(mid, "worldcell_queue_deliveries_total", queue=q, outcome="dropped") == 1
        assert delta(mid, "worldcell_queue_deliveries_total", queue=q, outcome="rescheduled") == 1
        assert delta(mid, "worldcell_queue_deliveries_total", queue=q, outcome="retried") == 2
        assert delta(mid, "worldcell_queue_attempt_duration_seconds_count", queue=q) == 5
        # first attempts measure from enqueue: 250 ms + 10 ms of virtual time, all in the 0.5 s bucket
        assert delta(mid, "worldcell_queue_delivery_latency_seconds_bucket", queue=q, le="0.25") == 0
        assert delta(mid, "worldcell_queue_delivery_latency_seconds_bucket", queue=q, le="0.5") == 5
        # gauges: two retries and the 503 are pending again, nothing in flight
        assert value(mid, "worldcell_queue_pending", shard="q:0") == 3
        assert value(mid, "worldcell_queue_inflight", shard="q:0") == 0
        assert value(mid, "worldcell_queue_dead_letters", shard="q:0") == 0

        clock.advance(120_000)  # past the backoff and the 503's 30 s
        tick(clock, 10)
        after = scrape(client)
        assert delta(after, "worldcell_queue_deliveries_total", queue=q, outcome="dead_lettered") == 2
        assert value(after, "worldcell_queue_dead_letters", shard="q:0") == DeadLetter.objects.count() == 2
        assert value(after, "worldcell_queue_pending", shard="q:0") == Message.objects.filter(due_at__isnull=False).count()
    finally:
        clock.uninstall()


def test_most_overdue_alarm_and_active_runs(client, rpc):
    from queueing.models import QueueCell as Row
    from worldcell import clock

    Row.objects.create(name="q:late", queue_shards=1, pinned_at=0, alarm_at=clock.now_ms() - 42_000)
    samples = scrape(client)
    assert 41.5 < value(samples, "worldcell_queue_alarm_overdue_seconds") < 60
    assert value(samples, "worldcell_runs", status="pending") == 0


def test_pending_counts_are_capped(client, settings):
    from queueing.models import QueueCell as Row

    settings.METRICS_COUNT_CAP = 3
    cell = Row.objects.create(name="q:big", queue_shards=1, pinned_at=0)
    Message.objects.bulk_create([
        Message(cell=cell, message_id=f"m{i}", queue_name="q", pathname="step", body='""', target_base_url="http://x",
                enqueued_at=0, due_at=1, updated_at=0) for i in range(5)
    ])
    assert value(scrape(client), "worldcell_queue_pending", shard="q:big") == 3


def test_metrics_token(client, settings):
    settings.METRICS_TOKEN = "scrape-me"
    resp = client.get("/metrics")
    assert resp.status_code == 401 and resp["WWW-Authenticate"] == "Bearer"
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    scrape(client, HTTP_AUTHORIZATION="Bearer scrape-me")


def test_metrics_can_be_turned_off(client, settings):
    settings.METRICS_ENABLED = False
    assert client.get("/metrics").status_code == 404


def test_the_shipped_dashboard_and_alerts_use_only_metrics_that_exist(client, rpc):
    import json
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    rpc.ok("queue", "q:0", "stats")
    exposed = client.get("/metrics").content.decode()
    names = set(re.findall(r"^# TYPE (worldcell_\w+) ", exposed, re.M))
    dashboard = (root / "contrib" / "grafana" / "worldcell.json").read_text()
    json.loads(dashboard)
    alerts = (root / "contrib" / "prometheus" / "alerts.yml").read_text()
    used = set(re.findall(r"\b(worldcell_[a-z_]+)", dashboard + alerts))
    unknown = {u for u in used if re.sub(r"_(bucket|count|sum|total)$", "", u) not in names and u not in names}
    assert not unknown, unknown


def _series(samples, name) -> set[tuple]:
    return {labels for (n, labels) in samples if n == name}


def test_random_queue_names_keep_the_series_count_bounded(client, settings):
    import random

    from worldcell import metrics

    settings.METRICS_QUEUE_NAMES = 100
    rng = random.Random(7)
    kinds = ["__wkf_workflow_", "__wkf_step_", ""]
    names = [kinds[i % 3] + "".join(rng.choices("abcdefghijklmnopqrstuvwxyz0123456789", k=rng.randint(8, 1000)))
             for i in range(1000)]
    before = scrape(client)
    for name in names:
        metrics.record_enqueue(name, deduped=False)
    after = scrape(client)
    # the series this test added (the registry keeps earlier tests' series)
    series = _series(after, "worldcell_queue_enqueued_total") - _series(before, "worldcell_queue_enqueued_total")
    labels = {dict(s)["queue"] for s in series}
    # at most 100 names by themselves (only those up to 200 characters) and the three kind buckets
    assert len(labels - {"other_workflow", "other_step", "other"}) <= 100
    assert all(len(label) <= 200 for label in labels)
    assert len(series) <= 103
    assert value(after, "worldcell_queue_enqueued_total", queue="other_step") > 0
    # every enqueue is counted somewhere
    total = sum(v for (n, _), v in after.items() if n == "worldcell_queue_enqueued_total")
    assert total - sum(v for (n, _), v in before.items() if n == "worldcell_queue_enqueued_total") == 1000


def test_a_scrape_over_500_cells_is_one_query_for_the_shard_gauges(client, settings, django_assert_max_num_queries):
    from queueing.models import QueueCell as Row

    settings.METRICS_SHARDS = 20
    cells = Row.objects.bulk_create([Row(name=f"q:{i}", queue_shards=500, pinned_at=0) for i in range(500)])
    # the busiest cell has 4 pending messages, 30 more cells have 1 each
    busy = [cells[7]] * 4 + cells[100:130]
    Message.objects.bulk_create([
        Message(cell=cell, message_id=f"m{i}", queue_name="q", pathname="step", body='""', target_base_url="http://x",
                enqueued_at=0, due_at=1, updated_at=0) for i, cell in enumerate(busy)
    ])
    # the whole scrape: the shard gauges (1), the alarm (1), active runs (1), the runs estimate (PostgreSQL)
    with django_assert_max_num_queries(4):
        samples = scrape(client)
    shards = {dict(s)["shard"] for s in _series(samples, "worldcell_queue_pending")}
    assert len(shards) == 21 and "other" in shards
    assert value(samples, "worldcell_queue_pending", shard="q:7") == 4
    assert value(samples, "worldcell_queue_pending", shard="other") == 30 - 19
    assert sum(v for (n, _), v in samples.items() if n == "worldcell_queue_pending") == 34
