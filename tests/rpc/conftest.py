"""A real API server per kind, started as README.md says, on a fresh database: waitress (the
production command), gunicorn alone, and gunicorn behind nginx with contrib/nginx-gunicorn.conf."""
from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile

from pathlib import Path
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
import pytest

from tests.conftest import encode_component
from tests.e2e.fleet_processes import ROOT, api_server, free_port, fresh_database, wait_healthy
from worldcell import codec


@dataclass
class Server:
    kind: str
    url: str
    port: int
    secret: str
    database_url: str = ""

    def call(self, binding: str, name: str, method: str, *args):
        """POST one RPC with httpx; returns ``(status, decoded body)``."""
        resp = httpx.post(
            f"{self.url}/v1/rpc/{binding}/{encode_component(name)}/{method}",
            content=codec.encode(list(args)), headers={"Authorization": f"Bearer {self.secret}"}, timeout=10,
        )
        return resp.status_code, codec.decode(resp.content)


NGINX = shutil.which("nginx") or (shutil.which("nginx", path="/usr/sbin:/usr/local/sbin"))
NGINX_CONF = ROOT / "contrib" / "nginx-gunicorn.conf"


@contextlib.contextmanager
def nginx_front(upstream_port: int):
    """Run nginx in the foreground with contrib/nginx-gunicorn.conf in front of ``upstream_port``; yields its port."""
    if NGINX is None:
        pytest.skip("nginx is not installed (apt-get install nginx-light)")
    port = free_port()
    prefix = Path(tempfile.mkdtemp(prefix="wc-nginx-"))
    prefix.chmod(0o777)  # nginx's workers may run as nobody and spool bodies here
    site = NGINX_CONF.read_text().replace("127.0.0.1:8787", f"127.0.0.1:{port}").replace(
        "127.0.0.1:8000", f"127.0.0.1:{upstream_port}")
    temp = " ".join(f"{k}_temp_path {prefix / k};" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    (prefix / "nginx.conf").write_text(
        f"daemon off; worker_processes 1; pid {prefix / 'nginx.pid'}; error_log {prefix / 'error.log'} warn;\n"
        f"events {{ worker_connections 1024; }}\n"
        f"http {{ access_log off; {temp}\n{site}\n}}\n")
    proc = subprocess.Popen([NGINX, "-p", str(prefix), "-c", str(prefix / "nginx.conf")],
                            stdout=subprocess.DEVNULL, stderr=open(prefix / "stderr.log", "ab"))
    try:
        wait_healthy(f"http://127.0.0.1:{port}", [proc], timeout_s=20)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(prefix, ignore_errors=True)


@contextlib.contextmanager
def running(kind: str, tmp_path):
    """``kind``: ``waitress``, ``gunicorn`` or ``nginx`` (gunicorn behind the contrib front)."""
    server_kind = "gunicorn" if kind == "nginx" else kind
    with fresh_database(tmp_path) as url, \
            api_server(server_kind, url, tmp_path, tmp_path / f"{kind}.log") as (base, secret, _):
        port = urlsplit(base).port
        if kind != "nginx":
            yield Server(kind, base, port, secret, url)
            return
        with nginx_front(port) as front:
            yield Server(kind, f"http://127.0.0.1:{front}", front, secret, url)


@pytest.fixture(scope="module", params=["waitress", "gunicorn", "nginx"])
def server(request, tmp_path_factory):
    """Each README API setup in turn (module scope: started once per module and kind)."""
    with running(request.param, tmp_path_factory.mktemp(request.param)) as srv:
        yield srv


@pytest.fixture(scope="module")
def production_server(tmp_path_factory):
    """The README's production API command (waitress)."""
    with running("waitress", tmp_path_factory.mktemp("production")) as srv:
        yield srv


@pytest.fixture(scope="module")
def gunicorn_behind_nginx(tmp_path_factory):
    """gunicorn as the README's comment starts it, behind contrib/nginx-gunicorn.conf."""
    with running("nginx", tmp_path_factory.mktemp("nginx")) as srv:
        yield srv
