"""Registers each cell service of this app with ``worldcell.dispatch``.

Each implemented binding adds one ``register_binding`` call here.
"""
from worldcell.dispatch import register_binding

from .index import IndexCell
from .runs import RunCell
from .streams import StreamCell

register_binding(
    "index",
    IndexCell,
    {
        "get": "get",
        "put": "put",
        "delete": "delete",
        "list": "list_keys",
        "reserveHookToken": "reserve_hook_token",
        "finalizeHookIndexes": "finalize_hook_indexes",
        "releaseHookToken": "release_hook_token",
        "deleteHookIndexes": "delete_hook_indexes",
    },
)
register_binding(
    "streams",
    StreamCell,
    {
        "writeChunk": "write_chunk",
        "closeStream": "close_stream",
        "getChunks": "get_chunks",
        "getInfo": "get_info",
        "registerStream": "register_stream",
        "listStreams": "list_streams",
    },
)
register_binding(
    "runs",
    RunCell,
    {
        "applyEvent": "apply_event",
        "getRun": "get_run",
        "getStep": "get_step",
        "getEvent": "get_event",
        "listEvents": "list_events",
        "listSteps": "list_steps",
        "listHooks": "list_hooks",
    },
)
