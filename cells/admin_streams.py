"""The console's streams: the viewer (every chunk of a run's stream, page by page), its download, the run page's list.

* ``stream_page`` — the context of ``<run>/stream/?name=<name>&from=<index>&as=text|json|hex``:
  ``CHUNKS_PER_PAGE`` chunks by index range (indexes are dense, so a page is
  one range scan on the ``(stream, index)`` unique index), each decoded as
  UTF-8 text, JSON or a hex dump from its first ``CHUNK_VIEW_BYTES`` bytes.
* ``stream_download`` — ``<run>/stream/download/?name=<name>``: the whole
  stream as one ``StreamingHttpResponse``, read ``DOWNLOAD_BATCH`` chunks at a
  time (memory bounded by one batch whatever the stream's length).
* ``stream_rows`` — the run page's streams section: each registered stream
  with its state and a preview of its first and last chunk (``CHUNK_PREVIEW_BYTES``),
  at most ``STREAMS_SHOWN`` streams, in three queries.

A stream is shown only under a run that registered it (``run-streams:<runId>``,
docs/protocol.md §8.1). Non-bytes chunks (§12 A11, codec text in ``value``)
are written to the download as their decoded bytes, string, or JSON text.
"""
from __future__ import annotations

import json
from typing import Any, Iterator
from urllib.parse import urlencode

from django.db.models import Q
from django.http import Http404, StreamingHttpResponse
from django.urls import reverse
from django.utils.html import format_html

from worldcell import codec, display
from worldcell.admin_site import format_datetime, status_badge
from worldcell.tenancy import DEFAULT_TENANT  # the console shows the default tenant's runs (docs/tenants.md)

from .models import Stream, StreamChunk, StreamRegistration

__all__ = [
    "CHUNKS_PER_PAGE", "CHUNK_PREVIEW_BYTES", "CHUNK_VIEW_BYTES", "DOWNLOAD_BATCH", "STREAMS_SHOWN", "VIEW_MODES",
    "chunk_bytes", "stream_download", "stream_page", "stream_rows",
]

#: Chunks shown per page.
CHUNKS_PER_PAGE = 100
#: Bytes of a chunk read for its view (a longer chunk says how much more it holds).
CHUNK_VIEW_BYTES = 16_384
#: Chunks read per query while downloading.
DOWNLOAD_BATCH = 200
#: The decoding switch.
VIEW_MODES = ("text", "json", "hex")
#: Streams listed on the run page.
STREAMS_SHOWN = 50
#: Bytes of a stream chunk read for its preview.
CHUNK_PREVIEW_BYTES = 96


def registered_stream(run_id: str, name: str) -> Stream | None:
    """The ``Stream`` row of ``name`` if run ``run_id`` registered it (Http404 otherwise; None = nothing written)."""
    if not StreamRegistration.objects.filter(tenant=DEFAULT_TENANT, cell=f"run-streams:{run_id}", name=name).exists():
        raise Http404("no such stream for this run")
    return Stream.objects.filter(tenant=DEFAULT_TENANT, name=f"stream:{name}").first()


def chunk_bytes(data: bytes | None, value: str | None) -> bytes:
    """A chunk's content as bytes: ``data`` as is; a codec ``value`` decoded (bytes, UTF-8 string, or JSON)."""
    if data is not None:
        return bytes(data)
    if value is None:
        return b""
    decoded = codec.decode(value)
    if isinstance(decoded, (bytes, bytearray)):
        return bytes(decoded)
    if isinstance(decoded, str):
        return decoded.encode("utf-8", "surrogatepass")
    return json.dumps(decoded, ensure_ascii=False, default=str).encode("utf-8", "surrogatepass")


def _render_chunk(content: bytes, total: int, mode: str) -> str:
    """One chunk's cell: ``content`` (its head) as text / JSON / hex, plus a note when cut."""
    cut = total > len(content)
    note = format_html(' <span class="wc-cut">… ({} more bytes)</span>', f"{total - len(content):,}") if cut else ""
    if mode == "hex":
        rows = [content[i : i + 16] for i in range(0, len(content), 16)]
        dump = "\n".join(f"{i * 16:08x}  {r.hex(' ')}" for i, r in enumerate(rows))
        return format_html('<span class="wc-hex">{}</span>{}', dump, note)
    text = content.decode("utf-8", "replace")
    if mode == "json" and not cut:
        try:
            return display.render_value(json.loads(text))
        except ValueError:
            return format_html('<span class="wc-cut">not JSON</span> {}', text)
    return format_html("{}{}", text, note)


def stream_page(run_id: str, name: str, start: int, mode: str) -> dict[str, Any]:
    """Template context of one page of stream ``name`` from chunk ``start`` (see the module docstring)."""
    stream = registered_stream(run_id, name)
    mode = mode if mode in VIEW_MODES else "text"
    count = stream.count if stream is not None else 0
    start = max(0, min(start, max(count - 1, 0)))
    rows = []
    if stream is not None and count:
        chunks = (
            StreamChunk.objects.filter(stream=stream, index__gte=start, index__lt=start + CHUNKS_PER_PAGE)
            .defer("data", "value")
            .annotate(**display.binary_annotations("data", head=CHUNK_VIEW_BYTES), **display.payload_annotations("value"))
            .order_by("index")
        )
        for c in chunks:
            if c.pv_data_size is not None:
                head, total = bytes(c.pv_data_head), int(c.pv_data_size)
                kind = "bytes"
            else:
                stored = display.stored_text(c, "value")
                if stored is not None and not stored.complete:
                    rows.append({"index": c.index, "kind": "value", "size": stored.size,
                                 "html": display.render_payload(stored, inline=True)})
                    continue
                content = chunk_bytes(None, stored.head if stored is not None else None)
                head, total = content[:CHUNK_VIEW_BYTES], len(content)
                kind = "value"
            rows.append({"index": c.index, "kind": kind, "size": total, "html": _render_chunk(head, total, mode)})
    return {
        "stream_name": name,
        "stream": stream,
        "chunk_rows": rows,
        "mode": mode,
        "modes": VIEW_MODES,
        "start": start,
        "count": count,
        "prev_start": max(start - CHUNKS_PER_PAGE, 0) if start > 0 else None,
        "next_start": start + CHUNKS_PER_PAGE if start + CHUNKS_PER_PAGE < count else None,
        "last_start": max(count - 1, 0) // CHUNKS_PER_PAGE * CHUNKS_PER_PAGE,
        "per_page": CHUNKS_PER_PAGE,
    }


def _iter_stream(stream_id: int, count: int) -> Iterator[bytes]:
    """The bytes of chunks ``0 .. count-1``, ``DOWNLOAD_BATCH`` rows per query."""
    for lo in range(0, count, DOWNLOAD_BATCH):
        batch = (
            StreamChunk.objects.filter(stream_id=stream_id, index__gte=lo, index__lt=lo + DOWNLOAD_BATCH)
            .order_by("index")
            .values_list("data", "value")
        )
        for data, value in batch:
            yield chunk_bytes(data, value)


def stream_download(run_id: str, name: str) -> StreamingHttpResponse:
    """The whole stream ``name`` as ``application/octet-stream`` (the chunks written when the download began)."""
    stream = registered_stream(run_id, name)
    count = stream.count if stream is not None else 0
    response = StreamingHttpResponse(
        _iter_stream(stream.pk, count) if stream is not None else iter(()), content_type="application/octet-stream"
    )
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)[:120] or "stream"
    response["Content-Disposition"] = f'attachment; filename="{safe}.bin"'
    response["X-Stream-Chunks"] = str(count)
    return response


def stream_rows(run_id: str, run_pk: int) -> list[dict[str, Any]]:
    """The run's streams: registry ``run-streams:<runId>`` -> ``stream:<name>`` rows -> first/last chunks."""
    stream_base = reverse("admin:cells_run_stream", args=[run_pk])
    download_base = reverse("admin:cells_run_stream_download", args=[run_pk])
    names = list(
        StreamRegistration.objects.filter(tenant=DEFAULT_TENANT, cell=f"run-streams:{run_id}")
        .order_by("name")
        .values_list("name", flat=True)[:STREAMS_SHOWN]
    )
    if not names:
        return []
    streams = {s.name: s for s in Stream.objects.filter(tenant=DEFAULT_TENANT, name__in=[f"stream:{n}" for n in names])}
    wanted = Q()
    for s in streams.values():
        if s.count > 0:
            wanted |= Q(stream_id=s.pk, index=0) | Q(stream_id=s.pk, index=s.count - 1)
    chunks: dict[tuple[int, int], StreamChunk] = {}
    if wanted:
        rows = (
            StreamChunk.objects.filter(wanted)
            .defer("data", "value")
            .annotate(
                **display.binary_annotations("data", head=CHUNK_PREVIEW_BYTES),
                **display.payload_annotations("value", head=display.INLINE_HEAD_CHARS),
            )
        )
        chunks = {(c.stream_id, c.index): c for c in rows}
    out = []
    for name in names:
        stream = streams.get(f"stream:{name}")
        row: dict[str, Any] = {"name": name, "stream": stream}
        if stream is not None:
            query = urlencode({"name": name})
            row["view_url"] = f"{stream_base}?{query}"
            row["download_url"] = f"{download_base}?{query}"
        if stream is not None and stream.count > 0:
            row["first"] = _chunk_preview(chunks.get((stream.pk, 0)))
            if stream.count > 1:
                row["last"] = _chunk_preview(chunks.get((stream.pk, stream.count - 1)))
        if stream is not None:
            row["state"] = status_badge("closed" if stream.closed else "open")
            row["updated"] = format_datetime(stream.updated_at)
        out.append(row)
    return out


def _chunk_preview(chunk: StreamChunk | None) -> str:
    if chunk is None:
        return "—"
    head = getattr(chunk, "pv_data_head", None)
    if head is not None:
        return display.render_bytes(bytes(head), chunk.pv_data_size)
    return display.render_payload(display.stored_text(chunk, "value"), inline=True)
