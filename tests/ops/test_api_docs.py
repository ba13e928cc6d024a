"""``/v1/docs`` documents exactly what the router accepts (issue 12 part 5).

The docs table ``worldcell.api_docs.METHODS`` must list every registered
(binding, method) with the service method's own parameter names, and every
example in it must be accepted by the real validation through both routes.
"""
from __future__ import annotations

import inspect
import json

import pytest
from django.test import override_settings

from tests.conftest import encode_component
from worldcell import api_docs, dispatch

pytestmark = pytest.mark.django_db


def _registered() -> dict[tuple[str, str], list[str]]:
    out = {}
    for name, b in dispatch.registered().items():
        for wire, attr in b.methods.items():
            params = [p.name for p in inspect.signature(getattr(b.factory, attr)).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "self"]
            out[(name, wire)] = params
    return out


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.title() for w in rest)


def test_every_routed_method_is_documented_with_its_own_arguments():
    registered = _registered()
    assert set(api_docs.METHODS) == set(registered)
    assert {b for b, _ in registered} == set(dispatch.KNOWN_BINDINGS)
    for key, params in registered.items():
        documented = [name for name, _, _ in api_docs.METHODS[key]["args"]]
        assert documented == [_camel(p) for p in params], key


def test_the_schema_documents_post_only_with_bodies_errors_and_the_bearer_scheme(admin_client):
    schema = admin_client.get("/v1/openapi.json").json()
    assert schema["components"]["securitySchemes"]["worldSecret"] == {
        "type": "http", "scheme": "bearer", "description": "WORLD_SECRET (CELLD_WORLD_SECRET in the Node app)"}
    for binding, method in api_docs.METHODS:
        ops = schema["paths"][f"/v1/rpc/{binding}/{{name}}/{method}"]
        assert list(ops) == ["post"], (binding, method, list(ops))
        op = ops["post"]
        assert op["security"] == [{"worldSecret": []}]
        body = op["requestBody"]["content"]["application/json"]["schema"]
        assert body["type"] == "array"
        assert [i["title"] for i in body["prefixItems"]] == [a[0] for a in api_docs.METHODS[(binding, method)]["args"]]
        assert set(op["responses"]) == {"200", "400", "401", "404", "413", "500", "503"}
        assert op["responses"]["401"]["content"]["application/json"]["schema"]["title"] == "ErrorBody"
    assert list(schema["paths"]["/v1/rpc/{binding}/{name}/{method}"]) == ["post"]
    assert list(schema["paths"]["/v1/health"]) == ["get"]


@pytest.mark.parametrize("fast_path", [True, False])
def test_every_example_is_accepted_by_the_real_route(rpc, fast_path):
    with override_settings(WORLDCELL_RPC_FAST_PATH=fast_path):
        for (binding, method), entry in api_docs.METHODS.items():
            if entry.get("example") is None:
                continue
            cell = entry.get("cell", "wrun_docs")
            resp = rpc.raw(f"/v1/rpc/{binding}/{encode_component(cell)}/{method}", json.dumps(entry["example"]))
            assert resp.status_code == 200, (binding, method, resp.content[:300])


def test_non_post_verbs_still_get_the_protocol_answer(rpc):
    with override_settings(WORLDCELL_RPC_FAST_PATH=False):
        resp = rpc.raw("/v1/rpc/queue/q%3A0/stats", b"[]", method="GET")
        assert resp.status_code == 404 and json.loads(resp.content)["error"]["name"] == "NotFound"
        resp = rpc.raw("/v1/rpc/queue/q%3A0/stats", b"[]", method="PUT", headers={"Authorization": None})
        assert resp.status_code == 401
