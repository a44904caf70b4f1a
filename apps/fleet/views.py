"""`GET /metrics`, outside /v1: Prometheus scrapes plain text, not the API's JSON."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_safe

from apps.fleet.access import NotStaff, metrics_allowed
from apps.fleet.metrics import metrics_text
from inline_farm.endpoints import error_body

# The classic text format, which every Prometheus reads (metric names here are plain ASCII).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@require_safe
def metrics(request: HttpRequest) -> HttpResponse:
    """The farm's metrics (apps/fleet/metrics.py) for staff tokens and allowed networks."""
    try:
        metrics_allowed(request)
    except NotStaff as refused:
        code = "unauthorized" if refused.status == 401 else "forbidden"
        response = JsonResponse(error_body(code, refused.message), status=refused.status)
        if refused.status == 401:
            response["WWW-Authenticate"] = "Bearer"
        return response
    return HttpResponse(metrics_text(), content_type=CONTENT_TYPE)
