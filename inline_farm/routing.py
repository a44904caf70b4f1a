"""Websocket routes (Channels)."""

from __future__ import annotations

from typing import Any

from django.urls import path

from apps.importer.comfy_urls import websocket_urlpatterns as comfy_websocket_urlpatterns
from apps.runs.consumers import RunEventsConsumer

websocket_urlpatterns: list[Any] = [
    path("v1/runs/<str:run_id>/events", RunEventsConsumer.as_asgi()),
    *comfy_websocket_urlpatterns,  # ComfyUI's /ws (apps/importer/comfy_ws.py)
]
