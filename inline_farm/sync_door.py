"""HTTP requests through Django's *sync* handler, in one hop onto a persistent thread pool.

Django's ASGI handler runs sync views with three hand-offs per request — the event loop to a
thread for the middleware chain, back to the loop for the inner handler, and to the thread
again for the view — on a thread it creates for each request (asgiref's per-request
ThreadSensitiveContext executor). py-spy on the hot path (bench/hotpath.py) put ~6% of the web
process's samples in `Thread.start` alone, and the hand-offs wait for the GIL each time.

Every view of the farm is sync, so here a request is read in the loop, handed ONCE to a pool of
long-lived threads that runs Django's sync handler (the same middleware, URLs and views) and
collects the response, then written back by the loop. A request whose body is large or of
unknown length (an upload over INLINE_MAX_BODY_BYTES, a chunked body) goes to Django's ASGI
handler instead, which spools it to disk and streams as before. /v1/ requests run a shorter
middleware chain (settings.API_MIDDLEWARE: no sessions, CSRF, auth or messages, which a
Bearer-token API never reads). The poll of one run, `GET /v1/runs/{id}`, is first offered to
inline_farm/run_door.py, which answers a plain 200 without this handler.
"""

from __future__ import annotations

import asyncio
import io
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.conf import settings
from django.core import signals
from django.core.exceptions import RequestDataTooBig
from django.core.handlers.asgi import ASGIHandler, ASGIRequest, get_script_prefix
from django.core.handlers.base import BaseHandler
from django.http import JsonResponse
from django.http.response import HttpResponseBase
from django.test.utils import override_settings
from django.urls import set_script_prefix

from inline_farm.run_door import Reply, RunDoor

log = logging.getLogger(__name__)

Scope = dict[str, Any]


class SyncDoor:
    """Wrap `fallback` (Django's ASGI app): small-bodied HTTP requests go through the sync
    handler on `threads` long-lived threads (at most one database connection each)."""

    def __init__(self, fallback: Any, threads: int) -> None:
        self.fallback = fallback
        self.handler = BaseHandler()
        self.handler.load_middleware(is_async=False)
        # /v1/: settings.API_MIDDLEWARE. Django's handler loads its chain from
        # settings.MIDDLEWARE; that is swapped for this one load, at startup, before any request.
        self.api_handler = BaseHandler()
        with override_settings(MIDDLEWARE=settings.API_MIDDLEWARE):
            self.api_handler.load_middleware(is_async=False)
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="http")
        self.runs = RunDoor()  # most polls of a run are answered there, without this handler

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not _small_body(scope):
            await self.fallback(scope, receive, send)
            return
        body = await _read_body(receive)
        if body is None:
            return  # the client went away before its body arrived
        loop = asyncio.get_running_loop()
        respond = self._poll if self.runs.wants(scope) else self._respond
        status, headers, content = await loop.run_in_executor(self.pool, respond, scope, body)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": content})

    def _poll(self, scope: Scope, body: bytes) -> Reply:
        """`GET /v1/runs/{id}`: the run door's answer, or else Django's."""
        return self.runs.answer(scope) or self._respond(scope, body)

    def _respond(self, scope: Scope, body: bytes) -> Reply:
        """On a pool thread: what ASGIHandler.handle does, synchronously."""
        set_script_prefix(get_script_prefix(scope))
        signals.request_started.send(sender=ASGIHandler, scope=scope)
        response: HttpResponseBase
        try:
            request = ASGIRequest(scope, io.BytesIO(body))
        except UnicodeDecodeError:  # as Django's ASGI handler, in the API's error shape
            response = _error(400, "bad_request", "the request's path or query is not UTF-8")
        except RequestDataTooBig:
            response = _error(413, "too_large", "the request body is over the limit")
        else:
            handler = self.api_handler if request.path_info.startswith("/v1/") else self.handler
            response = handler.get_response(request)
        try:
            content = (b"".join(response) if response.streaming  # type: ignore[arg-type]
                       else response.content)  # type: ignore[attr-defined]
            return response.status_code, _headers(response), content
        finally:
            response.close()  # request_finished: the thread's connection goes back to the pool


def _error(status: int, code: str, message: str) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "message": message}}, status=status)


def _small_body(scope: Scope) -> bool:
    """A body of declared length up to INLINE_MAX_BODY_BYTES, or none at all."""
    length: bytes | None = None
    for name, value in scope.get("headers") or ():
        if name == b"content-length":
            length = value
        elif name == b"transfer-encoding":
            return False
    if length is None:
        return scope.get("method") in ("GET", "HEAD", "DELETE", "OPTIONS")
    try:
        return 0 <= int(length) <= settings.INLINE_MAX_BODY_BYTES
    except ValueError:
        return False


async def _read_body(receive: Any) -> bytes | None:
    parts: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts)


def _headers(response: HttpResponseBase) -> list[tuple[bytes, bytes]]:
    headers = [(name.encode("ascii"), value.encode("latin1"))
               for name, value in response.items()]
    headers += [(b"Set-Cookie", c.output(header="").encode("ascii").strip())
                for c in response.cookies.values()]
    return headers
