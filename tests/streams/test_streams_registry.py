"""The registry role of the streams cell: stream names per run (docs/protocol.md §4.2, §8.2; §11.10 items 148, 150)."""
import pytest

from cells.models import StreamRegistration

pytestmark = pytest.mark.django_db


def register(rpc, run_id, name):
    return rpc.ok("streams", f"run-streams:{run_id}", "registerStream", name)


def listed(rpc, run_id):
    return rpc.ok("streams", f"run-streams:{run_id}", "listStreams")


def test_it_lists_registered_names_sorted_and_once(rpc):
    assert register(rpc, "wrun_1", "b") is None
    assert register(rpc, "wrun_1", "a") is None
    assert register(rpc, "wrun_1", "a") is None
    assert listed(rpc, "wrun_1") == ["a", "b"]
    assert StreamRegistration.objects.filter(cell="run-streams:wrun_1").count() == 2


def test_it_keeps_each_runs_registry_apart(rpc):
    register(rpc, "wrun_list", "stream-a")
    register(rpc, "wrun_list", "stream-b")
    register(rpc, "wrun_other", "stream-c")
    assert listed(rpc, "wrun_list") == ["stream-a", "stream-b"]
    assert listed(rpc, "wrun_other") == ["stream-c"]
    assert listed(rpc, "wrun_unknown") == []


def test_it_sorts_names_bytewise(rpc):
    names = ["B", "a", "a/b", "a:b", "é", "\uffff", "\U0001f600", "Z", "_", "%"]
    for name in names:
        register(rpc, "wrun_s", name)
    assert listed(rpc, "wrun_s") == sorted(names, key=lambda n: n.encode("utf-8"))


def test_it_accepts_an_empty_name(rpc):
    register(rpc, "wrun_e", "")
    assert listed(rpc, "wrun_e") == [""]


@pytest.mark.parametrize("args", [[], [None], [5], [["a"]], ["nul\u0000"]])
def test_it_rejects_a_name_that_is_not_a_storable_string_with_400(rpc, args):
    status, body = rpc("streams", "run-streams:wrun_v", "registerStream", *args)
    assert (status, body["error"]["name"]) == (400, "ValidationError")
    assert body["error"]["message"].startswith("name:")
    assert listed(rpc, "wrun_v") == []


def test_it_registers_and_writes_like_the_client_does(rpc):
    # §11.4 item 27: register on run-streams:<runId>, write and close on stream:<name>.
    register(rpc, "wrun_s1", "wire-stream")
    assert rpc.ok("streams", "stream:wire-stream", "writeChunk", "hello ".encode()) == 0
    register(rpc, "wrun_s1", "wire-stream")
    assert rpc.ok("streams", "stream:wire-stream", "writeChunk", bytes([0xF0, 0x9F])) == 1
    rpc.ok("streams", "stream:wire-stream", "closeStream")
    assert rpc.ok("streams", "stream:wire-stream", "getInfo") == {"tailIndex": 1, "done": True}
    page = rpc.ok("streams", "stream:wire-stream", "getChunks", {"startIndex": 0, "limit": 33})
    assert page["chunks"] == [b"hello ", bytes([0xF0, 0x9F])]
    assert listed(rpc, "wrun_s1") == ["wire-stream"]
    status, body = rpc("streams", "stream:wire-stream", "writeChunk", b"more")
    assert status == 500 and "closed stream" in body["error"]["message"]
