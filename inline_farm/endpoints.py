"""What every /v1 endpoint module uses: Bearer authentication, the caller, the error type and
the error statuses it declares, and JSON answers rendered as the API renders them.

The NinjaAPI root (inline_farm/api.py) imports each app's router; the routers import this
module, never the root, so no import runs in a circle.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse
from ninja import Schema
from ninja.responses import Response
from ninja.security import HttpBearer

from apps.accounts.selectors import user_for_token
from inline_farm.schemas import ErrorOut


class BearerToken(HttpBearer):
    """`Authorization: Bearer <token>`: the request's user is the token's user."""

    def authenticate(self, request: HttpRequest, token: str) -> Any:
        user = user_for_token(token)
        if user is not None:
            request.user = user
        return user


def caller(request: HttpRequest) -> User:
    """The authenticated user of an endpoint behind BearerToken (never anonymous there)."""
    user = request.user
    assert isinstance(user, User), "endpoint reached without authentication"
    return user


# What a 429 tells the client to wait before trying again (the `Retry-After` header, seconds).
RETRY_AFTER_SECONDS = 5

# pydantic error types raised by our own validators: their type is the error's stable code.
OWN_ERROR_CODES = frozenset({"invalid_text"})


class ApiError(Exception):
    """An error with an HTTP status and a stable code, answered as {error:{code,message,…}}.

    `headers` go on the response as they are (e.g. `Retry-After`); a 429 always gets one.
    """

    def __init__(
        self, status: int, code: str, message: str, node_id: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.node_id = status, code, message, node_id
        self.headers = dict(headers or {})
        if status == 429:
            self.headers.setdefault("Retry-After", str(RETRY_AFTER_SECONDS))


def errors(*statuses: int) -> dict[int, type[Schema]]:
    """The error statuses an endpoint declares in the OpenAPI schema, each with the error shape:
    `response={200: RunOut, **errors(401, 404)}`."""
    return dict.fromkeys(statuses, ErrorOut)


def error_body(code: str, message: str, node_id: str | None = None) -> dict[str, Any]:
    """The error shape, for answers built outside ninja (middleware, URL handlers)."""
    body: dict[str, Any] = {"code": code, "message": message}
    if node_id is not None:
        body["nodeId"] = node_id
    return {"error": body}


def respond(body: Any, *, status: int) -> HttpResponse:
    """`body` as JSON with `status`, exactly as the API renders an endpoint's return value (for
    answers whose status or headers depend on the request: 201 vs 200, 503, an ETag)."""
    return Response(body, status=status, content_type="application/json; charset=utf-8")
