"""Serving a blob's bytes over HTTP: streamed from disk in bounded memory, with ETag and Range.

Takes are immutable and content-addressed, so the sha256 is a strong ETag and a client may ask
for any byte range of them (a video player seeking, a download resumed). Under Django's ASGI
handler (inline_farm/asgi.py sends these routes there) the body is an asynchronous iterator:
Django sends each chunk as it is read and, when the client goes away, cancels the response,
which stops the reading (a synchronous iterator would be read whole into memory first:
StreamingHttpResponse consumes one with `list()` under ASGI). Under a WSGI handler it is a
synchronous iterator, which the server pulls a chunk at a time.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase

from apps.takes.storage import BlobMissing, blob_path
from inline_farm.endpoints import error_body

CHUNK_BYTES = 256 * 1024
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


def blob_response(
    request: HttpRequest, *, sha256: str, media_type: str, filename: str,
) -> HttpResponseBase:
    """The answer to a GET of blob `sha256`: 304 when the client holds it, 206 for one
    satisfiable byte range, 416 for an unsatisfiable one, else 200 with every byte.
    Raises BlobMissing when the bytes are not on disk."""
    etag = f'"{sha256}"'
    headers = {"ETag": etag, "Accept-Ranges": "bytes",
               "Cache-Control": "private, max-age=31536000, immutable"}
    if _etag_matches(request.headers.get("If-None-Match", ""), etag):
        return HttpResponse(status=304, headers=headers)
    path = blob_path(sha256)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise BlobMissing(f"blob {sha256} is missing from {path.parent.parent}") from None
    try:
        wanted = _wanted_range(request, etag, size)
    except _Unsatisfiable:
        return JsonResponse(
            error_body("range_not_satisfiable", f"the range {request.headers['Range']!r} holds "
                       f"no byte of these {size}"), status=416,
            headers={**headers, "Content-Range": f"bytes */{size}"})
    start, end = wanted or (0, size - 1)
    response = StreamingHttpResponse(
        _read(path, start, end + 1) if _under_asgi(request) else _read_sync(path, start, end + 1),
        status=206 if wanted else 200, content_type=media_type,
        headers={**headers, "Content-Length": str(end + 1 - start),
                 "Content-Disposition": f'inline; filename="{filename}"'},
    )
    if wanted:
        response["Content-Range"] = f"bytes {start}-{end}/{size}"
    return response


def _etag_matches(header: str, etag: str) -> bool:
    tags = [t.strip().removeprefix("W/") for t in header.split(",")]
    return "*" in tags or etag in tags


class _Unsatisfiable(Exception):
    """The byte range asked for starts past the end (or ends before it starts)."""


def _wanted_range(request: HttpRequest, etag: str, size: int) -> tuple[int, int] | None:
    """The one byte range (first, last) asked for; None to send everything (no Range, a Range
    this server does not serve, such as several ranges, or an If-Range for other bytes).
    Raises _Unsatisfiable for a range that holds no byte of the blob."""
    header = request.headers.get("Range", "")
    match = _RANGE.fullmatch(header.strip())
    if match is None or request.headers.get("If-Range", etag) != etag:
        return None
    first, last = match.groups()
    if not first and not last:
        return None
    if not first:  # the last N bytes
        start, end = max(size - int(last), 0), size - 1
    else:
        start, end = int(first), min(int(last), size - 1) if last else size - 1
    if start >= size or (last and first and int(last) < start) or size == 0:
        raise _Unsatisfiable
    return start, end


def _under_asgi(request: HttpRequest) -> bool:
    return "wsgi.input" not in request.META  # a WSGI request's META is the WSGI environ


async def _read(path: Path, start: int, stop: int) -> AsyncIterator[bytes]:
    """Bytes [start, stop) of `path`, a chunk at a time, each read on a thread."""
    fd = await asyncio.to_thread(os.open, path, os.O_RDONLY)
    try:
        position = start
        while position < stop:
            chunk = await asyncio.to_thread(os.pread, fd, min(CHUNK_BYTES, stop - position),
                                            position)
            if not chunk:
                return  # the file ended early (it cannot, being immutable; never loop on it)
            position += len(chunk)
            yield chunk
    finally:
        os.close(fd)


def _read_sync(path: Path, start: int, stop: int) -> Iterator[bytes]:
    """`_read` for a WSGI server."""
    with open(path, "rb") as f:
        position = start
        while position < stop:
            chunk = os.pread(f.fileno(), min(CHUNK_BYTES, stop - position), position)
            if not chunk:
                return
            position += len(chunk)
            yield chunk
