"""A real API server per kind (waitress, gunicorn), started as README.md says, on a fresh database."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
import pytest
from django.conf import settings

from tests.conftest import encode_component
from tests.e2e.fleet_processes import api_server, fresh_database
from worldcell import codec


@dataclass
class Server:
    kind: str
    url: str
    port: int
    secret: str

    def call(self, binding: str, name: str, method: str, *args):
        """POST one RPC with httpx; returns ``(status, decoded body)``."""
        resp = httpx.post(
            f"{self.url}/v1/rpc/{binding}/{encode_component(name)}/{method}",
            content=codec.encode(list(args)), headers={"Authorization": f"Bearer {self.secret}"}, timeout=10,
        )
        return resp.status_code, codec.decode(resp.content)


@contextlib.contextmanager
def running(kind: str, tmp_path):
    db = settings.DATABASES["default"]
    postgres = db if db["ENGINE"].endswith("postgresql") else None
    with fresh_database(tmp_path, postgres) as url, \
            api_server(kind, url, tmp_path, tmp_path / f"{kind}.log") as (base, secret, _):
        yield Server(kind, base, urlsplit(base).port, secret)


@pytest.fixture(scope="module", params=["waitress", "gunicorn"])
def server(request, tmp_path_factory):
    """Each README API server in turn (module scope: started once per module and kind)."""
    with running(request.param, tmp_path_factory.mktemp(request.param)) as srv:
        yield srv


@pytest.fixture(scope="module")
def production_server(tmp_path_factory):
    """The README's production API command (waitress)."""
    with running("waitress", tmp_path_factory.mktemp("production")) as srv:
        yield srv
