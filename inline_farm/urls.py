from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import include, path

from apps.fleet import views as fleet_views
from inline_farm.api import api

admin.site.site_header = admin.site.site_title = "Inline Farm"
admin.site.index_title = "Runs, takes and the fleet"
admin.site.enable_nav_sidebar = False  # the changelists need its 300 px (readable at 1280 px)

urlpatterns = [
    path("admin/", admin.site.urls),
    path("v1/", api.urls),
    path("metrics", fleet_views.metrics, name="metrics"),  # Prometheus text, staff or allow-list
    path("", include("apps.importer.comfy_urls")),  # ComfyUI's API under /comfy/
]


def handler404(request: HttpRequest, exception: Any = None) -> HttpResponse:
    """Unknown URLs answer in the API's error shape (the admin keeps Django's own page)."""
    if request.path.startswith("/admin/"):
        from django.views.defaults import page_not_found

        return page_not_found(request, exception)
    return JsonResponse(
        {"error": {"code": "not_found", "message": f"no route {request.method} {request.path}"}},
        status=404,
    )


def handler500(request: HttpRequest) -> HttpResponse:
    """A crash answers in the API's error shape, except in the admin: Django's HTML error page."""
    if request.path.startswith("/admin/"):
        from django.views.defaults import server_error

        return server_error(request)
    return JsonResponse(
        {"error": {"code": "internal", "message": "the farm hit an internal error; it was logged"}},
        status=500,
    )


def handler400(request: HttpRequest, exception: Any = None) -> HttpResponse:
    """A request Django refuses before routing (e.g. a Host not in ALLOWED_HOSTS), in the
    API's error shape; the message never reads the request's host again (that raises)."""
    message = str(exception) if exception is not None else "bad request"
    return JsonResponse({"error": {"code": "bad_request", "message": message}}, status=400)
