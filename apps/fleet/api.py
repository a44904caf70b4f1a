"""/v1/health (no auth) and /v1/workers (the caller's view of the fleet)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from ninja import Router

from apps.fleet.access import NotStaff, staff_caller
from apps.fleet.families import worker_families
from apps.fleet.health import health_report
from apps.fleet.metrics import queue_overview
from apps.fleet.schemas import HealthOut, WorkersOut
from apps.fleet.selectors import workers_live
from inline_farm.endpoints import ApiError, caller, errors, respond

router = Router(tags=["health"])


@router.get("health", auth=None, summary="Liveness and readiness",
            response={200: HealthOut, 503: HealthOut, **errors(401, 403, 422)})
def health(request: HttpRequest, detail: bool = False) -> HttpResponse:
    """Each dependency's state (apps/fleet/health.py); 503 when the database, the broker or the
    channel layer is down. Live workers are counted, never a reason for 503.

    `?detail=1` (staff tokens only) adds `queues`: per queue, queued and running runs, the oldest
    queued run's age and the live workers serving it (read fresh, never cached)."""
    body = health_report()
    if detail and body["database"] == "ok":
        try:
            staff_caller(request)
        except NotStaff as refused:
            code = "unauthorized" if refused.status == 401 else "forbidden"
            raise ApiError(refused.status, code, refused.message) from None
        body = {**body, "queues": queue_overview()}
    return respond(body, status=503 if body["down"] else 200)


@router.get("workers", summary="Live workers: queues, device, models held",
            response={200: WorkersOut, **errors(401)})
def list_workers(request: HttpRequest) -> dict[str, Any]:
    """Every live worker: its queues, device, the model files and families it holds, and its
    memory at its last heartbeat; for staff callers also where it runs (host and pid: what
    `./farm check --destructive` needs to stop one)."""
    staff = caller(request).is_staff
    return {"items": [
        {"name": w.name, "state": w.state, "pool": w.pool.name if w.pool else None,
         "queues": w.queues, "device": w.device,
         "models": w.model_files, "families": worker_families(w.model_files),
         "lastHeartbeat": w.last_heartbeat.isoformat() if w.last_heartbeat else None,
         "memory": w.stats.get("memory"),
         **({"host": w.hostname, "pid": w.pid} if staff else {})}
        for w in workers_live().select_related("pool")
    ]}
