"""/v1/health (no auth) and /v1/workers (the caller's view of the fleet)."""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.http import HttpRequest, HttpResponse
from ninja import Router

from apps.fleet.selectors import workers_live
from inline_farm.api import api

router = Router(tags=["health"])


@router.get("health", auth=None, summary="Liveness and readiness")
def health(request: HttpRequest) -> HttpResponse:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        database = "ok"
    except Exception as exc:  # noqa: BLE001 — health reports, it does not raise
        database = f"error: {type(exc).__name__}"
    body = {"status": "ok" if database == "ok" else "degraded", "database": database,
            "workers": workers_live().count() if database == "ok" else None}
    return api.create_response(request, body, status=200 if database == "ok" else 503)


@router.get("workers", summary="Live workers: queues, device, models held")
def list_workers(request: HttpRequest) -> dict[str, Any]:
    return {"items": [
        {"name": w.name, "state": w.state, "queues": w.queues, "device": w.device,
         "models": w.model_files, "lastHeartbeat": w.last_heartbeat.isoformat()
         if w.last_heartbeat else None}
        for w in workers_live()
    ]}
