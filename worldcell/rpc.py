"""The RPC route: raw-path routing, auth, body cap, decoding and dispatch (docs/protocol.md §2).

``handle(request)`` applies the normative decision order of §2.2 to any
request under ``/v1`` and returns the response. It knows nothing about events
or queues: it finds a registered cell service in ``worldcell.dispatch`` and
calls it.
"""
from __future__ import annotations

import logging
import re
import time
from typing import Any
from urllib.parse import unquote_to_bytes, urlsplit, quote

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse

from . import codec, credentials, dispatch, metrics
from .errors import CellError

log = logging.getLogger("worldcell.rpc")

MAX_BODY_BYTES = 33_554_432  # docs/protocol.md §2.2 checks 9-10: exactly 32 MiB is accepted
HEALTH_BODY = b'{"ok":true,"name":"world-celld","version":"0.1.0","specVersion":3}'
_READ_CHUNK = 1 << 20
_PERCENT_OK = re.compile(r"%(?![0-9A-Fa-f]{2})")


class BodyTooLarge(Exception):
    """The request body exceeded MAX_BODY_BYTES while it was being read."""


class BodyUnreadable(Exception):
    """The request body could not be read whole: broken chunked framing, or the
    connection ended before ``Content-Length`` bytes arrived (docs/http-servers.md "Broken framing").
    """


def json_response(body: bytes | str, status: int = 200) -> HttpResponse:
    """An ``application/json`` response with ``body`` as given."""
    return HttpResponse(body, status=status, content_type="application/json")


def error_response(status: int, name: str, message: str, err_status: int | None = None) -> HttpResponse:
    """The fixed error body ``{"error":{"name":…,"message":…}}`` of §2.9."""
    err: dict[str, Any] = {"name": name, "message": message}
    if err_status is not None:
        err["status"] = err_status
    return json_response(codec.encode({"error": err}), status)


def raw_path(request: HttpRequest) -> str:
    """The request path exactly as sent, still percent-encoded, without query (§2.1).

    Uses the server's raw request target (gunicorn ``RAW_URI``, waitress and
    uWSGI ``REQUEST_URI``); falls back to re-quoting ``PATH_INFO`` when the
    server gives none (then an encoded ``%2F`` cannot be told from ``/``).
    """
    meta = request.META
    raw = meta.get("RAW_URI") or meta.get("REQUEST_URI")
    if raw:
        if not raw.startswith("/"):
            raw = urlsplit(raw).path or "/"  # absolute-form request target
        return raw.split("?", 1)[0].split("#", 1)[0]
    path = meta.get("PATH_INFO", request.path)
    # PATH_INFO is latin-1-decoded bytes per PEP 3333; re-encode to the wire form.
    return quote(path.encode("latin-1", "replace"), safe="/:@!$&'()*+,;=-._~%")


def decode_cell_name(segment: str) -> str | None:
    """Percent-decode a name segment with ``decodeURIComponent`` semantics (§2.7).

    ``segment`` is the raw path segment as the WSGI server hands it over
    (PEP 3333: request bytes decoded as latin-1), so raw non-ASCII bytes sent
    without percent-encoding are taken back to bytes and read as UTF-8, the
    way a WHATWG URL parser would. Returns the decoded name, or None for a
    malformed escape or invalid UTF-8.
    """
    if _PERCENT_OK.search(segment):
        return None
    try:
        raw = segment.encode("latin-1")
    except UnicodeEncodeError:  # not from a WSGI server: already text
        raw = segment.encode("utf-8", "surrogatepass")
    try:
        return unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        return None


def _read_body(request: HttpRequest) -> bytes:
    """Read the whole body, never more than MAX_BODY_BYTES + 1 bytes (§2.2 checks 9-10).

    Returns the body bytes. Raises BodyTooLarge as soon as the running total
    passes the cap, and BodyUnreadable when the server's ``wsgi.input`` fails
    (gunicorn raises ``InvalidChunkSize``/``NoMoreData``/``ChunkMissingTerminator``
    or a parse error of the trailers; Django wraps ``OSError`` as
    ``UnreadablePostError``) or returns fewer bytes than ``Content-Length``
    declared (gunicorn's reader returns short when the client half-closes).
    A body cut anywhere is never handed to a cell (docs/http-servers.md).
    """
    meta = request.META
    length_text = (meta.get("CONTENT_LENGTH") or "").strip()
    buf = bytearray()
    if length_text:
        stream = request  # Django limits reads to CONTENT_LENGTH
    elif "chunked" in meta.get("HTTP_TRANSFER_ENCODING", "").lower():
        stream = meta["wsgi.input"]  # Django would see an empty body here
    else:
        return b""
    while True:
        try:
            chunk = stream.read(_READ_CHUNK)
        except Exception as exc:  # noqa: BLE001 - any failure of the server's reader is the client's framing
            raise BodyUnreadable(f"{type(exc).__name__} after {len(buf)} bytes") from exc
        if not chunk:
            break
        buf += chunk
        if len(buf) > MAX_BODY_BYTES:
            raise BodyTooLarge()
    if length_text.isdigit() and len(buf) < int(length_text):
        raise BodyUnreadable(f"body ended after {len(buf)} of {int(length_text)} bytes")
    return bytes(buf)


def _content_length_too_large(request: HttpRequest) -> bool:
    text = (request.META.get("CONTENT_LENGTH") or "").strip()
    try:
        return float(text) > MAX_BODY_BYTES if text else False
    except ValueError:
        return False  # Number("abc") is NaN upstream: check 9 ignores it


def handle(request: HttpRequest) -> HttpResponse:
    """Answer one request under ``/v1`` following docs/protocol.md §2.2 step by step.

    A ``HEAD`` request gets the status and headers of the answer with no body
    (RFC 9110 §9.3.2), so a kept-alive connection stays in sync. Every answer
    carries ``Content-Length``: without it waitress falls back to a chunked
    answer and closes the connection after it (no keep-alive, pipelined
    requests dropped; docs/http-servers.md).

    Returns the HTTP response; never raises for bad input. Method errors are
    500 (``CellError`` name/message), validation errors 400, and unexpected
    exceptions 500 with their class name, logged with a traceback.
    """
    started = time.perf_counter()
    response = _answer(request)
    response["Content-Length"] = str(len(response.content))
    if request.method == "HEAD":
        response.content = b""
    metrics.observe_rpc(request.path_info, response.status_code, time.perf_counter() - started)
    return response


def _answer(request: HttpRequest) -> HttpResponse:
    path = raw_path(request)
    parts = [p for p in path.split("/") if p]
    # 1-3: path shape and health
    if not parts or parts[0] != "v1":
        return error_response(404, "NotFound", f"unknown path: {path}")
    if len(parts) == 2 and parts[1] == "health":
        return json_response(HEALTH_BODY)
    if len(parts) < 2 or parts[1] != "rpc":
        return error_response(404, "NotFound", f"unknown path: {path}")
    # 4-5: fail closed, then bearer auth
    try:
        if not credentials.configured():
            return error_response(503, "WorldNotConfigured", "WORLD_SECRET is not configured")
        identity = credentials.authenticate(request.META.get("HTTP_AUTHORIZATION"))
        if identity is None:
            return error_response(401, "Unauthorized", "invalid or missing bearer token")
    except credentials.CredentialsUnavailable:
        return error_response(503, "CredentialsUnavailable",
                              "the fleet cannot read its stored tenant secrets right now; retry")
    # 6-8: shape, binding, method
    if request.method != "POST" or len(parts) != 5:
        return error_response(404, "NotFound", "expected POST /v1/rpc/{binding}/{name}/{method}")
    _, _, binding_name, encoded_name, method = parts
    if binding_name not in dispatch.KNOWN_BINDINGS:
        return error_response(404, "NotFound", f"unknown binding: {binding_name}")
    binding = dispatch.lookup(binding_name, method)
    if binding is None:
        return error_response(404, "NotFound", f"unknown method: {binding_name}.{method}")
    # 9-12: body cap, codec, argument array
    if _content_length_too_large(request):
        return error_response(413, "PayloadTooLarge", f"body exceeds {MAX_BODY_BYTES} bytes")
    try:
        body = _read_body(request)
    except BodyTooLarge:
        return error_response(413, "PayloadTooLarge", f"body exceeds {MAX_BODY_BYTES} bytes")
    except BodyUnreadable as exc:
        log.info("%s %s: unreadable body: %s", request.method, path, exc)
        return error_response(400, "BadRequest", f"unreadable request body: {exc}")
    try:
        args = codec.decode(body)
    except codec.DecodeError:
        return error_response(400, "BadRequest", "malformed rpc body")
    del body
    if not isinstance(args, list):
        return error_response(400, "BadRequest", "body must be an argument array")
    # 13: the name (worldcell answers 400 for malformed escapes, §2.7)
    name = decode_cell_name(encoded_name)
    if name is None:
        return error_response(400, "BadRequest", "malformed percent-encoding in cell name")
    # 15: invoke
    try:
        result = dispatch.invoke(binding, name, method, args, tenant=identity.tenant)
    except CellError as exc:
        if exc.http_status >= 500:
            log.warning("%s.%s on %r raised %s: %s", binding_name, method, name, exc.name, exc.message)
        return error_response(exc.http_status, exc.name, exc.message, exc.status)
    except DatabaseError as exc:
        log.exception("%s.%s on %r: database error", binding_name, method, name)
        return error_response(500, type(exc).__name__, "database error: " + str(exc).splitlines()[0][:300])
    except Exception as exc:  # noqa: BLE001 - every other failure is a 500 with a logged traceback
        log.exception("%s.%s on %r failed", binding_name, method, name)
        status = getattr(exc, "status", None)
        return error_response(
            500, type(exc).__name__, str(exc)[:1000] or type(exc).__name__,
            status if isinstance(status, int) and not isinstance(status, bool) else None,
        )
    try:
        text = codec.encode(result)
    except (TypeError, ValueError) as exc:
        log.exception("%s.%s on %r returned an unencodable value", binding_name, method, name)
        return error_response(500, "EncodeError", str(exc)[:300])
    return json_response(text)
