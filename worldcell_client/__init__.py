"""worldcell_client: a Python client that speaks to a worldcell fleet like the world-celld JS client.

Importing it loads neither Django nor Celery (only ``httpx`` and the pure
wire codec ``worldcell.codec``), so scripts, tests and the benchmark can use
it from outside a fleet::

    from worldcell_client import WorldClient
    world = WorldClient("http://127.0.0.1:8787", secret)
    world.list_runs(limit=10)

Modules: ``client`` (``WorldClient``, ``RpcCallError``), ``index_writes``
(the index calls after ``applyEvent``, shared with the console's *Cancel
run*), ``wire`` (ids, shard choice, key formats, the shared codec).
"""
from .client import RpcCallError, WorldClient
from .index_writes import INDEX_CELL, index_calls_after_apply_event, run_index_entries
from .wire import encode_uri_component, ms13, shard_for, shared_codec_dumps, ulid

__all__ = [
    "INDEX_CELL",
    "RpcCallError",
    "WorldClient",
    "encode_uri_component",
    "index_calls_after_apply_event",
    "ms13",
    "run_index_entries",
    "shard_for",
    "shared_codec_dumps",
    "ulid",
]
