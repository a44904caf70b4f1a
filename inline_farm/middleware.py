"""Request guards that act around the API: body size before Django reads a body, and the /v1
contract for what ninja answers outside an endpoint (405 in the error shape, HEAD as GET)."""

from __future__ import annotations

import os
from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.response import HttpResponseBase

MULTIPART_SLACK = 64 * 1024  # boundaries and part headers around the file itself
API_PREFIX = "/v1/"


def _error(status: int, code: str, message: str) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "message": message}}, status=status)


def _body_size(request: HttpRequest) -> int:
    """The larger of the declared Content-Length and what the server actually buffered.

    Under ASGI the body is already spooled (memory, then disk) before the request reaches Django;
    a chunked body has no Content-Length, so its buffered size is the only honest figure.
    """
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    stream = getattr(request, "_stream", None)
    seekable = getattr(stream, "seekable", None)
    if stream is None or seekable is None or not seekable():
        return declared
    buffered = stream.seek(0, os.SEEK_END)
    stream.seek(0)
    return max(declared, buffered)


class UploadSizeLimit:
    """Refuse a body over its limit with a 413 before Django reads (or parses) it.

    Asset uploads may carry up to INLINE_ASSET_MAX_BYTES (plus multipart framing); every other
    request body is bounded by INLINE_MAX_BODY_BYTES, well below Django's own limit, so a huge
    JSON document is never read into memory, parsed or stored.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method in ("POST", "PUT", "PATCH", "DELETE"):
            if request.path.rstrip("/") == "/v1/assets" or (
                request.path.startswith("/comfy/") and request.path.endswith("/upload/image")
            ):
                limit, what = settings.INLINE_ASSET_MAX_BYTES, "upload"
                allowed = limit + MULTIPART_SLACK
            else:
                limit, what = settings.INLINE_MAX_BODY_BYTES, "request body"
                allowed = limit
            size = _body_size(request)
            if size > allowed:
                return _error(413, "too_large", f"{what} is {size} bytes; the limit is {limit}")
        return self.get_response(request)


class ApiMethods:
    """HEAD on a /v1 GET route answers as GET without the body; a 405 answers in the error shape.

    ninja routes only the methods an endpoint declares and answers any other with a plain-text
    405; clients of /v1 always get `{"error": {code, message}}` and an `Allow` header.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path.startswith(API_PREFIX):
            return self.get_response(request)
        head = request.method == "HEAD"
        if head:
            request.method = request.META["REQUEST_METHOD"] = "GET"
        response = self.get_response(request)
        if response.status_code == 405 and not response.get("Content-Type", "").startswith(
            "application/json"
        ):
            response = self._not_allowed(request, response.get("Allow", ""), head)
        if head:
            request.method = request.META["REQUEST_METHOD"] = "HEAD"
            if response.streaming:  # its headers (Content-Length too) stand; nothing is read
                response.close()
                response = _headers_only(response)
            else:
                response.headers.setdefault("Content-Length", str(len(response.content)))
                response.content = b""
        return response

    @staticmethod
    def _not_allowed(request: HttpRequest, allow: str, head: bool) -> HttpResponse:
        methods = [m.strip() for m in allow.split(",") if m.strip()]
        if "GET" in methods and "HEAD" not in methods:
            methods.append("HEAD")
        method = "HEAD" if head else request.method
        response = _error(405, "method_not_allowed",
                          f"{method} is not allowed on {request.path}; allowed: {', '.join(methods)}")
        response["Allow"] = ", ".join(methods)
        return response


def _headers_only(response: HttpResponseBase) -> HttpResponse:
    bare = HttpResponse(status=response.status_code)
    for name, value in response.items():
        bare[name] = value
    return bare


class SyncChain:
    """The innermost middleware, sync-only on purpose: it makes Django run the whole chain and
    the (sync) views synchronously in one worker thread — one thread hop per request under ASGI.

    Without it the chain ran in async mode, and each of Django's middlewares hopped to a thread
    and back for its process_request / process_response: a dozen hops per request, measured as
    about a quarter of the web process's busy time on the hot path (bench/hotpath.py, py-spy).
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        return self.get_response(request)
