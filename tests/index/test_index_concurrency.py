"""Concurrency of the index cell: per-token serialization, no global lock (docs/protocol.md §1.3, §6.3).

Each thread has its own database connection and its own HTTP test client.
"""
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import transaction
from django.test import Client

from cells.models import lock_hook_token
from tests.conftest import RpcClient
from tests.services import in_thread

WORKERS = 32



def reserve(token, run_id):
    rpc = RpcClient(Client())
    return rpc.ok("index", "index", "reserveHookToken", token, {"runId": run_id, "hookId": "h"})


@pytest.mark.django_db(transaction=True)
def test_it_gives_one_token_to_exactly_one_of_32_racing_runs(rpc):
    barrier = threading.Barrier(WORKERS)

    @in_thread
    def race(i):
        barrier.wait()
        return reserve("contested", f"wrun_{i:02d}")

    with ThreadPoolExecutor(WORKERS) as pool:
        results = list(pool.map(race, range(WORKERS)))
    winners = [i for i, r in enumerate(results) if r == {"claimed": True}]
    assert len(winners) == 1
    winner = {"runId": f"wrun_{winners[0]:02d}", "hookId": "h"}
    assert all(r == {"claimed": False, "holder": winner} for i, r in enumerate(results) if i != winners[0])
    assert rpc.ok("index", "index", "get", "hookclaim:contested")["owner"] == winner


@pytest.mark.django_db(transaction=True)
def test_it_publishes_one_token_for_exactly_one_of_32_racing_finalizers(rpc):
    barrier = threading.Barrier(WORKERS)

    @in_thread
    def finalize(i):
        barrier.wait()
        owner = {"runId": f"wrun_{i:02d}", "hookId": f"h{i}"}
        hook = f'{{"runId":"wrun_{i:02d}","hookId":"h{i}","token":"tok"}}'
        return RpcClient(Client())("index", "index", "finalizeHookIndexes", "tok", f"h{i}", hook, owner)

    with ThreadPoolExecutor(WORKERS) as pool:
        results = list(pool.map(finalize, range(WORKERS)))
    assert sorted(status for status, _ in results) == [200] + [500] * (WORKERS - 1)
    refused = {body["error"]["message"] for status, body in results if status == 500}
    assert refused == {"Hook token tok is owned by another hook"}
    ids = [k["name"] for k in rpc.ok("index", "index", "list", {"prefix": "hookid:"})["keys"]]
    assert len(ids) == 1


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_it_lets_32_tokens_proceed_while_another_token_is_locked(rpc):
    held, release = threading.Event(), threading.Event()

    @in_thread
    def hold_token_zero():
        with transaction.atomic():
            lock_hook_token("index", "tok-00", tenant="default")
            held.set()
            assert release.wait(30)

    holder = threading.Thread(target=hold_token_zero)
    holder.start()
    try:
        assert held.wait(10)
        blocked_pool = ThreadPoolExecutor(1)
        blocked = blocked_pool.submit(in_thread(reserve), "tok-00", "wrun_blocked")
        with ThreadPoolExecutor(WORKERS) as pool:
            others = list(pool.map(in_thread(reserve), [f"tok-{i:02d}" for i in range(1, WORKERS + 1)],
                                   [f"wrun_{i}" for i in range(1, WORKERS + 1)], timeout=20))
        # every other token was reserved while tok-00 stayed locked ...
        assert others == [{"claimed": True}] * WORKERS
        # ... and the reservation of tok-00 itself is still waiting for the lock
        assert not blocked.done()
    finally:
        release.set()
        holder.join(10)
    assert blocked.result(timeout=10) == {"claimed": True}
    blocked_pool.shutdown()


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_it_serializes_plain_writes_of_a_token_key_with_the_token_lock(rpc):
    held, release = threading.Event(), threading.Event()

    @in_thread
    def hold():
        with transaction.atomic():
            lock_hook_token("index", "tok", tenant="default")
            held.set()
            assert release.wait(30)

    @in_thread
    def plain(key):
        RpcClient(Client()).ok("index", "index", "put", key, "v")
        return key

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        with ThreadPoolExecutor(2) as pool:
            token_key = pool.submit(plain, "hookclaim:tok")
            unrelated = pool.submit(plain, "run:wf:1")
            assert unrelated.result(timeout=10) == "run:wf:1"
            assert not token_key.done()
            release.set()
            assert token_key.result(timeout=10) == "hookclaim:tok"
    finally:
        release.set()
        holder.join(10)


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_it_does_not_serialize_puts_and_deletes_of_unrelated_keys(rpc):
    rpc.ok("index", "index", "put", "busy", "v0")
    held, release = threading.Event(), threading.Event()

    @in_thread
    def hold_row():
        # An open transaction holds the row lock of "busy" (as a slow put would).
        with transaction.atomic():
            RpcClient(Client()).ok("index", "index", "put", "busy", "v1")
            held.set()
            assert release.wait(30)

    holder = threading.Thread(target=hold_row)
    holder.start()
    try:
        assert held.wait(10)

        @in_thread
        def write(i):
            client = RpcClient(Client())
            client.ok("index", "index", "put", f"free:{i}", i)
            client.ok("index", "index", "delete", f"free:{i - 1}")
            return i

        with ThreadPoolExecutor(8) as pool:
            assert list(pool.map(write, range(WORKERS), timeout=20)) == list(range(WORKERS))
    finally:
        release.set()
        holder.join(10)
    assert rpc.ok("index", "index", "get", "busy") == "v1"


@pytest.mark.django_db(transaction=True)
def test_it_keeps_every_concurrent_put(rpc):
    @in_thread
    def put(i):
        RpcClient(Client()).ok("index", "index", "put", f"k:{i:03d}", i)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, range(64)))
    page = rpc.ok("index", "index", "list", {"prefix": "k:"})
    assert [k["name"] for k in page["keys"]] == [f"k:{i:03d}" for i in range(64)]
