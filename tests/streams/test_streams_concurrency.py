"""Concurrent writers on one stream get dense indexes and lose nothing (docs/protocol.md §8.2)."""
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.test import Client

from tests.conftest import RpcClient
from tests.services import in_thread

WRITERS = 32



@pytest.mark.django_db(transaction=True)
def test_it_gives_32_concurrent_writers_dense_indexes(rpc):
    barrier = threading.Barrier(WRITERS)

    @in_thread
    def writer(i):
        barrier.wait()
        return RpcClient(Client()).ok("streams", "stream:race", "writeChunk", f"w{i}".encode())

    with ThreadPoolExecutor(WRITERS) as pool:
        indexes = list(pool.map(writer, range(WRITERS)))
    assert sorted(indexes) == list(range(WRITERS))
    page = rpc.ok("streams", "stream:race", "getChunks", {"startIndex": 0})
    assert page["tailIndex"] == WRITERS - 1
    # each writer's chunk sits at the index it was told
    assert {page["chunks"][index]: index for index in indexes} == {
        f"w{i}".encode(): indexes[i] for i in range(WRITERS)
    }


@pytest.mark.django_db(transaction=True)
def test_it_never_accepts_a_write_after_a_concurrent_close(rpc):
    barrier = threading.Barrier(WRITERS + 1)

    @in_thread
    def writer(i):
        barrier.wait()
        return RpcClient(Client())("streams", "stream:closing", "writeChunk", bytes([i]))

    @in_thread
    def closer():
        barrier.wait()
        return RpcClient(Client()).ok("streams", "stream:closing", "closeStream")

    with ThreadPoolExecutor(WRITERS + 1) as pool:
        closing = pool.submit(closer)
        results = list(pool.map(writer, range(WRITERS)))
        closing.result()
    accepted = sorted(body for status, body in results if status == 200)
    refused = [body for status, body in results if status != 200]
    assert accepted == list(range(len(accepted)))
    assert all(b == {"error": {"name": "Error", "message": "Cannot write to a closed stream"}} for b in refused)
    page = rpc.ok("streams", "stream:closing", "getChunks", {"startIndex": 0})
    assert page["done"] is True
    assert len(page["chunks"]) == len(accepted) and page["tailIndex"] == len(accepted) - 1


@pytest.mark.django_db(transaction=True)
def test_it_registers_one_name_once_under_concurrency(rpc):
    @in_thread
    def register(i):
        return RpcClient(Client()).ok("streams", "run-streams:wrun_c", "registerStream", f"s{i % 4}")

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(register, range(WRITERS)))
    assert rpc.ok("streams", "run-streams:wrun_c", "listStreams") == ["s0", "s1", "s2", "s3"]
