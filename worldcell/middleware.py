"""Request plumbing for the raw-path RPC surface."""
from __future__ import annotations

import re

_SLASHES = re.compile(r"/{2,}")


class CollapseSlashesMiddleware:
    """Collapse repeated slashes in ``path_info`` so Django's URL resolver
    routes ``//v1//health/`` to the same view as ``/v1/health`` (PROTOCOL.md §2.1).

    The RPC handler itself always re-reads the raw request target, so nothing
    is lost by this normalisation.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if "//" in request.path_info:
            request.path_info = _SLASHES.sub("/", request.path_info)
        return self.get_response(request)
