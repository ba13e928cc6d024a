"""Registers each cell service of this app with ``worldcell.dispatch``.

Each implemented binding adds one ``register_binding`` call here.
"""
from worldcell.dispatch import register_binding

from .index import IndexCell
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
