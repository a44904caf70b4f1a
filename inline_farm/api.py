"""The /v1 NinjaAPI root: its authentication, an exception handler for every error (always the
`{"error": {code, message, nodeId?}}` shape), and each app's router."""

from __future__ import annotations

import logging
from typing import Any

import pydantic
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponse
from django.http.multipartparser import MultiPartParserError
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.parser import Parser

from apps.fleet.api import router as fleet_router
from apps.graphs.api import router as graphs_router
from apps.graphs.validation import GraphInvalid
from apps.importer.api import router as importer_router
from apps.runs.api import router as runs_router
from apps.takes.api import assets_router, takes_router
from inline_farm.endpoints import (
    OWN_ERROR_CODES,
    RETRY_AFTER_SECONDS,
    ApiError,
    BearerToken,
    error_body,
)
from inline_farm.jsondoc import json_parse

log = logging.getLogger(__name__)



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


api.add_router("/runs", runs_router)
api.add_router("/takes", takes_router)
api.add_router("/assets", assets_router)
api.add_router("/models", graphs_router)
api.add_router("/import", importer_router)
api.add_router("/", fleet_router)
