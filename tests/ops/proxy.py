"""A tiny TLS-terminating reverse proxy stand-in on 127.0.0.1 (for tests only).

It forwards each request to ``upstream`` unchanged (the client's ``Host``
header included, as ``proxy_set_header Host $host`` does) and adds
``X-Forwarded-Proto: https`` and ``X-Forwarded-For``, as nginx or a load
balancer in front of gunicorn would after terminating TLS.
"""
from __future__ import annotations

import contextlib
import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te", "trailer"}


@contextlib.contextmanager
def https_terminating_proxy(upstream: str, extra_headers: dict[str, str] | None = None):
    """Run the proxy on a free port; yields its ``http://127.0.0.1:<port>`` URL."""
    target = urlsplit(upstream)
    headers_to_add = {"X-Forwarded-Proto": "https", **(extra_headers or {})}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet
            pass

        def _forward(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
            headers.update(headers_to_add)
            headers["X-Forwarded-For"] = self.client_address[0]
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
            try:
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status, resp.reason)
                for k, v in resp.getheaders():
                    if k.lower() not in _HOP and k.lower() != "content-length":
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            finally:
                conn.close()

        do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = _forward

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
