"""Writes on the fleet: worker heartbeats, drain / resume."""

from __future__ import annotations

from typing import Any

from django.db.models.functions import Now

from apps.fleet.models import Worker, WorkerPool, WorkerState


def worker_heartbeat(
    *,
    name: str,
    hostname: str,
    pid: int,
    queues: list[str],
    node_types: list[str],
    model_files: list[dict[str, Any]],
    device: dict[str, Any],
    current_run_id: str | None,
    pool_name: str = "",
    incarnation: str = "",
    slots: int = 1,
    running: list[str] | None = None,
    stats: dict[str, Any] | None = None,
) -> Worker:
    """Record that worker `name` is alive and what it holds. A draining worker stays draining.

    Every worker belongs to a pool: `pool_name`, else the pool named after its device (created
    on first use, so ops see it in the admin). `last_heartbeat` is the database's clock, the
    one the reaper compares it with.
    """
    pool = WorkerPool.objects.get_or_create(
        name=pool_name or _default_pool_name(device),
        defaults={"gpu_type": str(device.get("device_name") or device.get("profile") or ""),
                  "vram_gb": float(device.get("vram_gb") or 0), "queues": queues},
    )[0]
    worker, created = Worker.objects.update_or_create(
        name=name,
        defaults={
            "hostname": hostname, "pid": pid, "queues": queues, "node_types": node_types,
            "model_files": model_files, "device": device, "current_run_id": current_run_id,
            "last_heartbeat": Now(), "pool": pool, "incarnation": incarnation,
            "slots": slots, "running": running or [], "stats": stats or {},
        },
    )
    if not created and worker.state == WorkerState.OFFLINE:
        Worker.objects.filter(pk=worker.pk, state=WorkerState.OFFLINE).update(
            state=WorkerState.ONLINE
        )
    return worker


def _default_pool_name(device: dict[str, Any]) -> str:
    """`local-cpu`, `local-gpu-24g`…: one pool per kind of device when ops named none."""
    if device.get("profile") == "cpu" or not device.get("vram_gb"):
        return "local-cpu"
    return f"local-gpu-{round(float(device['vram_gb']))}g"


def worker_set_offline(*, name: str, incarnation: str = "") -> None:
    """Mark a worker offline (it shut down cleanly), unless a newer process of the same name
    already took its place."""
    workers = Worker.objects.filter(name=name)
    if incarnation:
        workers = workers.filter(incarnation=incarnation)
    workers.update(state=WorkerState.OFFLINE, current_run=None, running=[])


def worker_drain(*, worker: Worker) -> bool:
    """Stop `worker` taking new runs (it finishes the one it holds). Compare-and-set."""
    from inline_farm.celery import app

    changed = Worker.objects.filter(pk=worker.pk, state=WorkerState.ONLINE).update(
        state=WorkerState.DRAINING
    )
    for queue in worker.queues:
        app.control.cancel_consumer(queue, destination=[worker.name])
    return bool(changed)


def worker_resume(*, worker: Worker) -> bool:
    """Let a drained worker take runs again. Compare-and-set."""
    from inline_farm.celery import app

    changed = Worker.objects.filter(pk=worker.pk, state=WorkerState.DRAINING).update(
        state=WorkerState.ONLINE
    )
    for queue in worker.queues:
        app.control.add_consumer(queue, destination=[worker.name])
    return bool(changed)
