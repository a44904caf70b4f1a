"""Django's WSGI handler under the ASGI server with one thread hop per plain request.

a2wsgi's `WSGIMiddleware` (the standard adapter, and this one's fallback) runs the app on a
thread pool and hands every message back to the event loop on its own: the response's start,
its body, then an empty last body, each a blocking round trip between the thread and the loop
(a coroutine, a task and two futures per message). For the farm's busiest requests — a poll of a
run, a submit: a body that arrived whole, a response that is one chunk — that was ~0.5 ms of
the web's CPU per request, a quarter of a poll's (bench/ab.py; README "Off the frameworks'
standard paths"). Here such a request costs one hop: the thread runs the app, reads its one
chunk and closes it (Django's request_finished: the connection goes back to the pool), and the
loop sends the start and the body.

Everything else goes as a2wsgi sends it: a body still arriving in pieces is handed, with what
was read of it, to a2wsgi's adapter (it reads on demand from the thread, so a large upload is
never held whole before Django's size checks); a streaming response is sent chunk by chunk as
the thread reads it. tests/test_onehop.py answers the same requests through both adapters and
compares the answers.
"""

from __future__ import annotations

import asyncio
import contextvars
import io
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from a2wsgi import WSGIMiddleware
from a2wsgi.wsgi import build_environ

Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

# What the thread hands back: the status, the headers and the whole body, or None once it has
# sent a streaming response itself.
Answer = tuple[int, list[tuple[bytes, bytes]], bytes] | None


class _WholeBody(io.BytesIO):
    """`wsgi.input` of a request whose whole body came in its first message."""


class OneHopWSGI:
    """An ASGI app of `app` (Django's WSGI handler) on `workers` threads."""

    def __init__(self, app: WSGIApp, workers: int) -> None:
        self.app = app
        self.fallback = WSGIMiddleware(app, workers=workers)  # type: ignore[arg-type]
        # One pool of threads (one per database connection the process may hold) for both.
        self.executor: ThreadPoolExecutor = self.fallback.executor

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.fallback(scope, receive, send)  # type: ignore[arg-type]
        first = await receive()
        if first.get("more_body") or first["type"] != "http.request":
            return await self.fallback(scope, _replay(first, receive), send)  # type: ignore[arg-type]
        environ: dict[str, Any] = build_environ(  # type: ignore[assignment]  # a TypedDict there
            scope, _WholeBody(first.get("body", b"")))  # type: ignore[arg-type]
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()
        respond = partial(context.run, self._respond, environ, loop, send)
        answer: Answer = await loop.run_in_executor(self.executor, respond)
        if answer is not None:
            status, headers, body = answer
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})

    def _respond(self, environ: dict[str, Any], loop: asyncio.AbstractEventLoop,
                 send: Send) -> Answer:
        """In a pool thread: run the app; a response of one chunk comes back whole, a streaming
        one is sent from here, chunk by chunk, as a2wsgi sends it."""
        started: list[Any] = []

        def start_response(status: str, headers: list[tuple[str, str]],
                           exc_info: Any = None) -> Callable[[bytes], None]:
            started[:] = [int(status.split(" ", 1)[0]), [
                (name.strip().encode("latin1").lower(), value.strip().encode("latin1"))
                for name, value in headers]]
            return _no_write

        response = self.app(environ, start_response)
        try:
            if not getattr(response, "streaming", False):
                return started[0], started[1], b"".join(response)
            _stream(response, started, loop, send)
            return None
        finally:
            close = getattr(response, "close", None)
            if close is not None:
                close()


def _stream(response: Iterable[bytes], started: list[Any], loop: asyncio.AbstractEventLoop,
            send: Send) -> None:
    async def sent(message: Message) -> None:
        await send(message)

    def out(message: Message) -> None:
        asyncio.run_coroutine_threadsafe(sent(message), loop).result()

    chunks = iter(response)
    first = next(chunks, b"")  # a generator's view runs here: start_response comes after it
    out({"type": "http.response.start", "status": started[0], "headers": started[1]})
    out({"type": "http.response.body", "body": first, "more_body": True})
    for chunk in chunks:
        out({"type": "http.response.body", "body": chunk, "more_body": True})
    out({"type": "http.response.body", "body": b""})


def _no_write(chunk: bytes) -> None:
    raise RuntimeError("write() of WSGI's start_response is not supported; return the body")


def _replay(first: Message, receive: Receive) -> Receive:
    """`receive` with `first`, already read, given again first."""
    pending = [first]

    async def again() -> Message:
        return pending.pop() if pending else await receive()

    return again
