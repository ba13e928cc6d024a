"""The django-ninja API object that serves ``/v1`` (docs/protocol.md §2).

Every operation hands the request to ``worldcell.rpc.handle``, which applies
the normative decision order on the *raw* request path (so ``%2F`` inside a
cell name survives). One documented ``POST`` operation per (binding, method), generated from
``worldcell.api_docs.METHODS`` (checked against ``worldcell.dispatch``'s table
by tests/ops/test_api_docs.py), makes ``/v1/docs`` list the whole surface with
argument shapes, results, error bodies and the bearer scheme; hidden twins of
each route take the other HTTP verbs so they still get the protocol's answer
(401 before 404, §2.2). The catch-all route makes odd shapes (``/v1/health/x``,
names that contain ``/``) answer exactly as the spec says. OpenAPI docs are
for staff only (Django admin login).
"""
from __future__ import annotations

from typing import Any

from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest
from ninja import NinjaAPI, Schema

from . import api_docs, rpc

class WorldcellAPI(NinjaAPI):
    """NinjaAPI whose OpenAPI schema also declares the bearer scheme (Swagger UI's Authorize button).

    ninja's own auth classes are not used: ``rpc.handle`` checks the bearer token in the
    protocol's decision order (docs/protocol.md §2.2, §2.4) and answers with its own bodies.
    """

    def get_openapi_schema(self, *args, **kwargs):
        schema = super().get_openapi_schema(*args, **kwargs)
        components = schema.setdefault("components", {})
        components.setdefault("securitySchemes", {})["worldSecret"] = {
            "type": "http", "scheme": "bearer", "description": "WORLD_SECRET (CELLD_WORLD_SECRET in the Node app)",
        }
        components.setdefault("schemas", {})["ErrorBody"] = api_docs.ERROR_BODY
        return schema


api = WorldcellAPI(
    title="worldcell RPC",
    version="0.1.0",
    description=(
        "Wire-compatible with the world-celld v0.1.0 fleet (docs/protocol.md). Every RPC is "
        "`POST /v1/rpc/{binding}/{cell name, URL-encoded}/{method}` with "
        "`Authorization: Bearer <WORLD_SECRET>` and a tagged-JSON **array** of positional arguments "
        "(dates `{\"__type\":\"Date\",\"iso\":…}`, bytes `{\"__type\":\"Uint8Array\",\"data\":<base64>}`). "
        "Errors are `{\"error\":{\"name\",\"message\"}}`. Operations below are generated from the "
        "dispatch table the router uses."
    ),
    urls_namespace="v1",
    docs_decorator=staff_member_required,
)

ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]
NOT_POST = [m for m in ALL_METHODS if m != "POST"]
SECURITY = [{"worldSecret": []}]


class Health(Schema):
    ok: bool
    name: str
    version: str
    specVersion: int


class RpcError(Schema):
    error: dict[str, Any]


@api.api_operation(["GET"], "/health", response={200: Health}, summary="Liveness and spec version", tags=["health"])
def health(request: HttpRequest):
    """Unauthenticated; any HTTP method answers the same (docs/protocol.md §2.3)."""
    return rpc.handle(request)


@api.api_operation(NOT_POST, "/health", include_in_schema=False)
def health_other_methods(request: HttpRequest):
    return rpc.handle(request)


def _document_method(binding: str, method: str) -> None:
    """One documented POST operation for ``binding.method`` and a hidden one for the other verbs."""
    entry = api_docs.METHODS[(binding, method)]
    path = f"/rpc/{binding}/{{name}}/{method}"

    def view(request: HttpRequest, name: str):
        return rpc.handle(request)

    view.__name__ = f"{binding}_{method}"
    api.api_operation(
        ["POST"], path, summary=entry["summary"], tags=[binding], operation_id=f"{binding}_{method}",
        description=f"`{binding}.{method}({', '.join(a[0] for a in entry['args'])})` — docs/protocol.md §4.",
        openapi_extra={"requestBody": api_docs.request_body(entry), "responses": api_docs.responses(entry),
                       "security": SECURITY},
    )(view)

    def other(request: HttpRequest, name: str):
        return rpc.handle(request)

    other.__name__ = f"{binding}_{method}_other"
    api.api_operation(NOT_POST, path, include_in_schema=False)(other)


for _binding, _method in sorted(api_docs.METHODS):
    _document_method(_binding, _method)


@api.api_operation(
    ["POST"],
    "/rpc/{binding}/{name}/{method}",
    summary="Invoke a whitelisted method on a cell (the generic form of the operations above)",
    tags=["rpc"],
    openapi_extra={"responses": api_docs.responses({"result": {}}), "security": SECURITY,
                   "requestBody": {"required": True, "content": {"application/json": {"schema": {"type": "array"}}}}},
)
def call(request: HttpRequest, binding: str, name: str, method: str):
    """POST only (other methods answer 404). Body: JSON argument array; result: the
    method's return value (docs/protocol.md §2.8, §4)."""
    return rpc.handle(request)


@api.api_operation(NOT_POST, "/rpc/{binding}/{name}/{method}", include_in_schema=False)
def call_other_methods(request: HttpRequest, binding: str, name: str, method: str):
    return rpc.handle(request)


@api.api_operation(ALL_METHODS, "/{path:rest}", include_in_schema=False)
def anything_else(request: HttpRequest, rest: str):
    return rpc.handle(request)
