"""Request plumbing for the raw-path RPC surface."""
from __future__ import annotations

import re

from django.conf import settings

_SLASHES = re.compile(r"/{2,}")


class CollapseSlashesMiddleware:
    """Collapse repeated slashes in ``path_info`` so Django's URL resolver
    routes ``//v1//health/`` to the same view as ``/v1/health`` (docs/protocol.md §2.1).

    The RPC handler itself always re-reads the raw request target, so nothing
    is lost by this normalisation.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if "//" in request.path_info:
            request.path_info = _SLASHES.sub("/", request.path_info)
        return self.get_response(request)


class RpcFastPathMiddleware:
    """Answer ``/v1/health`` and ``/v1/rpc/…`` straight from ``worldcell.rpc.handle``.

    The RPC surface needs none of the session, auth, CSRF or message
    middleware, nor ninja's operation layer (``rpc.handle`` re-reads the raw
    path and does its own auth): skipping them saves about 0.4 ms of CPU per
    call (measured in the benchmark notes), which matters at a thousand calls
    a second. Everything else under ``/v1`` (``/v1/docs``, ``/v1/openapi.json``)
    goes on to the ninja API. With ``WORLDCELL_RPC_FAST_PATH = False`` every
    call takes the ninja route instead, with the same answers.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if settings.WORLDCELL_RPC_FAST_PATH:
            path = request.path_info
            if "//" in path:
                path = _SLASHES.sub("/", path)
            # rpc.handle applies docs/protocol.md's whole decision table to any /v1 path,
            # so sending it a little more than the two routes is harmless.
            if path.startswith(("/v1/rpc", "/v1/health")):
                from . import rpc

                return rpc.handle(request)
        return self.get_response(request)
