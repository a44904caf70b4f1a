"""Request guards that must act before Django reads a body."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

MULTIPART_SLACK = 64 * 1024  # boundaries and part headers around the file itself


class UploadSizeLimit:
    """Refuse an asset upload whose declared size is over the limit, before it is spooled to disk."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method == "POST" and request.path.rstrip("/") == "/v1/assets":
            limit = settings.INLINE_ASSET_MAX_BYTES
            try:
                declared = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                declared = 0
            if declared > limit + MULTIPART_SLACK:
                return JsonResponse({"error": {
                    "code": "too_large",
                    "message": f"upload is {declared} bytes; the limit is {limit}",
                }}, status=413)
        return self.get_response(request)
