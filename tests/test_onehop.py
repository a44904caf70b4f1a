"""inline_farm/onehop.py answers every request as a2wsgi's adapter (the standard one) does: the
same status, headers and body, through Django's WSGI handler on the real database and through
plain WSGI apps that stream, for requests whose body comes whole or in pieces."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from a2wsgi import WSGIMiddleware
from django.core.wsgi import get_wsgi_application

from inline_farm.onehop import OneHopWSGI

Answer = tuple[int, list[tuple[bytes, bytes]], bytes]


def _call(app: Any, method: str, path: str, headers: dict[str, str],
          body_parts: list[bytes]) -> Answer:
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8188),
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
    parts = list(body_parts) or [b""]
    messages = [{"type": "http.request", "body": part, "more_body": i < len(parts) - 1}
                for i, part in enumerate(parts)]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await asyncio.sleep(3600)  # the client stays connected
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    start, bodies = sent[0], sent[1:]
    assert start["type"] == "http.response.start" and not bodies[-1].get("more_body")
    return start["status"], sorted(start["headers"]), b"".join(m["body"] for m in bodies)


def _both(wsgi: Any, *request: Any) -> tuple[Answer, Answer]:
    ours = _call(OneHopWSGI(wsgi, workers=2), *request)
    theirs = _call(WSGIMiddleware(wsgi, workers=2), *request)
    return ours, theirs


@pytest.fixture
def bearer(db: None) -> Iterator[dict[str, str]]:
    from apps.accounts.services import token_create, user_get_or_create

    user = user_get_or_create(username=f"onehop-{uuid.uuid4().hex[:8]}")
    yield {"Host": "127.0.0.1", "Authorization": f"Bearer {token_create(user=user)[1]}"}


@pytest.mark.django_db(transaction=True)
def test_djangos_answers_are_the_same_through_both_adapters(bearer: dict[str, str]) -> None:
    django_app = get_wsgi_application()
    bad_graph = json.dumps({"graph": {"nodes": {"a": {"type": "no/such"}}}, "target": "a"}).encode()
    json_type = {**bearer, "Content-Type": "application/json"}
    requests = [
        ("GET", "/v1/runs", bearer, []),
        ("GET", f"/v1/runs/{uuid.uuid4()}", bearer, []),  # 404
        ("HEAD", "/v1/runs", bearer, []),
        ("GET", "/v1/runs", {"Host": "127.0.0.1"}, []),  # 401
        ("PUT", "/v1/runs", bearer, []),  # 405
        ("POST", "/v1/runs", {**json_type, "Content-Length": str(len(bad_graph))}, [bad_graph]),
        ("POST", "/v1/runs", {**json_type, "Content-Length": str(len(bad_graph))},
         [bad_graph[:7], bad_graph[7:20], bad_graph[20:]]),  # the body in pieces: a2wsgi's path
        ("POST", "/v1/runs", {**json_type, "Content-Length": str(64 * 1024 * 1024)}, [b"{}"]),
        ("GET", "/v1/openapi.json", bearer, []),
    ]
    statuses = []
    for request in requests:
        ours, theirs = _both(django_app, *request)
        assert ours == theirs, request[:2]
        statuses.append(ours[0])
    assert statuses == [200, 404, 200, 401, 405, 422, 422, 413, 200]


def _streaming(environ: dict[str, Any], start_response: Any) -> Any:
    class Streamed:
        streaming = True  # as Django's StreamingHttpResponse says of itself
        closed = False

        def __iter__(self) -> Iterator[bytes]:
            yield b"one,"
            yield b""
            yield b"two," * 1000
            yield environ["wsgi.input"].read()

        def close(self) -> None:
            Streamed.closed = True

    start_response("200 OK", [("Content-Type", "text/csv"), ("X-Kind", " streamed ")])
    return Streamed()


def _plain(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    body = environ["wsgi.input"].read()
    start_response("201 Created", [("Content-Type", "text/plain"),
                                   ("Content-Length", str(len(body) + 5))])
    return [b"echo:" + body]


@pytest.mark.parametrize("app", [_streaming, _plain])
@pytest.mark.parametrize("parts", [[], [b"whole"], [b"in ", b"pie", b"ces"]])
def test_plain_wsgi_apps_answer_the_same_through_both_adapters(app: Any,
                                                               parts: list[bytes]) -> None:
    ours, theirs = _both(app, "POST", "/x", {"Host": "h"}, parts)
    assert ours == theirs
    assert ours[2].endswith(b"".join(parts))
