"""The django-ninja API object that serves ``/v1`` (docs/protocol.md §2).

Every operation hands the request to ``worldcell.rpc.handle``, which applies
the normative decision order on the *raw* request path (so ``%2F`` inside a
cell name survives). The typed operations below exist so that
``/v1/docs`` documents the surface; the catch-all route makes odd shapes
(``/v1/health/x``, names that contain ``/``) answer exactly as the spec says.
OpenAPI docs are for staff only (Django admin login).
"""
from __future__ import annotations

from typing import Any

from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest
from ninja import NinjaAPI, Schema

from . import rpc

api = NinjaAPI(
    title="worldcell RPC",
    version="0.1.0",
    description=(
        "Wire-compatible with the world-celld v0.1.0 fleet. Authenticate RPC calls with "
        "`Authorization: Bearer <WORLD_SECRET>`; the body is a tagged-JSON argument array. "
        "The contract (routes, codec, every binding's methods, errors, pagination, queue semantics) "
        "is docs/protocol.md in the worldcell repository; how the fleet is built is docs/architecture.md."
    ),
    urls_namespace="v1",
    docs_decorator=staff_member_required,
)

ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]


class Health(Schema):
    ok: bool
    name: str
    version: str
    specVersion: int


class RpcError(Schema):
    error: dict[str, Any]


@api.api_operation(ALL_METHODS, "/health", response={200: Health}, summary="Liveness and spec version")
def health(request: HttpRequest):
    """Unauthenticated; any HTTP method (docs/protocol.md §2.3)."""
    return rpc.handle(request)


@api.api_operation(
    ALL_METHODS,
    "/rpc/{binding}/{name}/{method}",
    response={200: Any, 400: RpcError, 401: RpcError, 404: RpcError, 413: RpcError, 500: RpcError, 503: RpcError},
    summary="Invoke a whitelisted method on a cell",
)
def call(request: HttpRequest, binding: str, name: str, method: str):
    """POST only (other methods answer 404). Body: JSON argument array; result: the
    method's return value (docs/protocol.md §2.8, §4)."""
    return rpc.handle(request)


@api.api_operation(ALL_METHODS, "/{path:rest}", include_in_schema=False)
def anything_else(request: HttpRequest, rest: str):
    return rpc.handle(request)
