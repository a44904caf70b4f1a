"""The /v1 NinjaAPI root: auth, the error shape, and each app's router."""

from __future__ import annotations

import logging
from typing import Any

import pydantic
from django.contrib.auth.models import User
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponse
from django.http.multipartparser import MultiPartParserError
from ninja import NinjaAPI, Schema
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.parser import Parser
from ninja.security import HttpBearer

from apps.accounts.selectors import user_for_token
from apps.graphs.validation import GraphInvalid
from inline_farm.jsondoc import json_parse
from inline_farm.schemas import ErrorOut

log = logging.getLogger(__name__)


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


class JsonBody(Parser):
    """Request bodies through the farm's one JSON rule (inline_farm/jsondoc.py): what it cannot
    read, ninja answers 400 "Cannot parse request body" (and the importer 422 `not_json`)."""

    def parse_body(self, request: HttpRequest) -> Any:
        return json_parse(request.body)


api = NinjaAPI(
    parser=JsonBody(),
    title="Inline Farm",
    version="1",
    urls_namespace="v1",
    auth=BearerToken(),
    docs_url="/docs",
    openapi_url="/openapi.json",
)


def error_body(code: str, message: str, node_id: str | None = None) -> dict[str, Any]:
    """The error shape, for answers built outside ninja (middleware, URL handlers)."""
    body: dict[str, Any] = {"code": code, "message": message}
    if node_id is not None:
        body["nodeId"] = node_id
    return {"error": body}


def error_response(
    request: HttpRequest, status: int, code: str, message: str, node_id: str | None = None,
    headers: dict[str, str] | None = None,
) -> HttpResponse:
    response = api.create_response(request, error_body(code, message, node_id), status=status)
    for name, value in (headers or {}).items():
        response[name] = value
    return response


@api.exception_handler(ApiError)
def _api_error(request: HttpRequest, exc: ApiError) -> HttpResponse:
    return error_response(request, exc.status, exc.code, exc.message, exc.node_id, exc.headers)


@api.exception_handler(GraphInvalid)
def _graph_invalid(request: HttpRequest, exc: GraphInvalid) -> HttpResponse:
    return error_response(request, 422, exc.code, exc.message, exc.node_id)


@api.exception_handler(ValidationError)
def _validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    code = next((e["type"] for e in exc.errors if e.get("type") in OWN_ERROR_CODES), "invalid_request")
    return error_response(request, 422, code, _describe(exc.errors), _node_of(exc.errors))


@api.exception_handler(pydantic.ValidationError)
def _pydantic_error(request: HttpRequest, exc: pydantic.ValidationError) -> HttpResponse:
    """A model built from client data inside an endpoint (e.g. an imported graph) refused it."""
    as_dicts: list[dict[str, Any]] = [dict(e) for e in exc.errors(include_url=False)]
    code = next((str(e["type"]) for e in as_dicts if e.get("type") in OWN_ERROR_CODES),
                "invalid_request")
    return error_response(request, 422, code, _describe(as_dicts), _node_of(as_dicts))


@api.exception_handler(MultiPartParserError)
def _bad_multipart(request: HttpRequest, exc: MultiPartParserError) -> HttpResponse:
    return error_response(request, 400, "bad_request", f"unreadable multipart body: {exc}")


@api.exception_handler(RequestDataTooBig)
def _too_big(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
    return error_response(request, 413, "too_large", "the request body is over the size limit")


@api.exception_handler(AuthenticationError)
def _unauthorized(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    return error_response(request, 401, "unauthorized", "a valid 'Authorization: Bearer <token>' "
                          "header is required")


@api.exception_handler(Http404)
def _not_found(request: HttpRequest, exc: Http404) -> HttpResponse:
    return error_response(request, 404, "not_found", str(exc) or "not found")


@api.exception_handler(HttpError)
def _http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    code = {400: "bad_request", 405: "method_not_allowed", 413: "too_large",
            415: "unsupported_media_type", 429: "too_many_requests"}.get(exc.status_code, "error")
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)} if exc.status_code == 429 else None
    return error_response(request, exc.status_code, code, str(exc), headers=headers)


@api.exception_handler(Exception)
def _unexpected(request: HttpRequest, exc: Exception) -> HttpResponse:
    log.exception("unhandled error on %s %s", request.method, request.path)
    return error_response(request, 500, "internal", "the farm hit an internal error; it was logged")


def _describe(errors: list[dict[str, Any]]) -> str:
    parts = []
    for err in errors[:5]:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p not in ("body", "payload"))
        parts.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


def _node_of(errors: list[dict[str, Any]]) -> str | None:
    """When a pydantic error sits under graph.nodes.<id>, that id names the node."""
    for err in errors:
        loc = [str(p) for p in err.get("loc", ())]
        if "nodes" in loc and loc.index("nodes") + 1 < len(loc):
            return loc[loc.index("nodes") + 1]
    return None


def _mount_routers() -> None:
    from apps.fleet.api import router as fleet_router
    from apps.graphs.api import router as graphs_router
    from apps.importer.api import router as importer_router
    from apps.runs.api import router as runs_router
    from apps.takes.api import assets_router, takes_router

    api.add_router("/runs", runs_router)
    api.add_router("/takes", takes_router)
    api.add_router("/assets", assets_router)
    api.add_router("/models", graphs_router)
    api.add_router("/import", importer_router)
    api.add_router("/", fleet_router)


_mount_routers()
