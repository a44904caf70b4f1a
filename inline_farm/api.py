"""The /v1 NinjaAPI root: auth, the error shape, and each app's router."""

from __future__ import annotations

import logging
from typing import Any

from django.contrib.auth.models import User
from django.http import Http404, HttpRequest, HttpResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.security import HttpBearer

from apps.accounts.selectors import user_for_token
from apps.graphs.validation import GraphInvalid

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


class ApiError(Exception):
    """An error with an HTTP status and a stable code, answered as {error:{code,message,…}}."""

    def __init__(self, status: int, code: str, message: str, node_id: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.node_id = status, code, message, node_id


api = NinjaAPI(
    title="Inline Farm",
    version="1",
    urls_namespace="v1",
    auth=BearerToken(),
    docs_url="/docs",
    openapi_url="/openapi.json",
)


def error_response(
    request: HttpRequest, status: int, code: str, message: str, node_id: str | None = None
) -> HttpResponse:
    body: dict[str, Any] = {"code": code, "message": message}
    if node_id is not None:
        body["nodeId"] = node_id
    return api.create_response(request, {"error": body}, status=status)


@api.exception_handler(ApiError)
def _api_error(request: HttpRequest, exc: ApiError) -> HttpResponse:
    return error_response(request, exc.status, exc.code, exc.message, exc.node_id)


@api.exception_handler(GraphInvalid)
def _graph_invalid(request: HttpRequest, exc: GraphInvalid) -> HttpResponse:
    return error_response(request, 422, exc.code, exc.message, exc.node_id)


@api.exception_handler(ValidationError)
def _validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    return error_response(request, 422, "invalid_request", _describe(exc.errors), _node_of(exc.errors))


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
            415: "unsupported_media_type"}.get(exc.status_code, "error")
    return error_response(request, exc.status_code, code, str(exc))


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
