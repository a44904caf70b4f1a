"""Routes of the ComfyUI front door: `/comfy/` (Bearer token) and `/comfy/k/<key>/` (a client
key in the URL), each also under `api/` as ComfyUI's newer frontend prefixes its calls."""

from __future__ import annotations

from typing import Any

from django.urls import include, path

from apps.importer import comfy_api as views
from apps.importer.comfy_ws import ComfyWsConsumer

_routes: list[Any] = [
    path("prompt", views.prompt),
    path("history", views.history),
    path("history/<str:prompt_id>", views.history_one),
    path("view", views.view),
    path("upload/image", views.upload_image),
    path("queue", views.queue),
    path("interrupt", views.interrupt),
    path("object_info", views.object_info_all),
    path("object_info/<str:node_class>", views.object_info_one),
    path("system_stats", views.system_stats),
    path("embeddings", views.embeddings),
    path("models", views.models),
    path("models/<str:folder>", views.models_in),
]

BASES = ("comfy/k/<str:key>/", "comfy/k/<str:key>/api/", "comfy/", "comfy/api/")

urlpatterns: list[Any] = [path(base, include(_routes)) for base in BASES]

websocket_urlpatterns: list[Any] = [path(f"{base}ws", ComfyWsConsumer.as_asgi()) for base in BASES]
