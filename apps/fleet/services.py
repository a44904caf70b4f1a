"""Writes on the fleet: worker heartbeats, drain / resume."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

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
) -> Worker:
    """Record that worker `name` is alive and what it holds. A draining worker stays draining."""
    pool = WorkerPool.objects.get_or_create(name=pool_name)[0] if pool_name else None
    worker, created = Worker.objects.update_or_create(
        name=name,
        defaults={
            "hostname": hostname, "pid": pid, "queues": queues, "node_types": node_types,
            "model_files": model_files, "device": device, "current_run_id": current_run_id,
            "last_heartbeat": timezone.now(), **({"pool": pool} if pool else {}),
        },
    )
    if not created and worker.state == WorkerState.OFFLINE:
        Worker.objects.filter(pk=worker.pk, state=WorkerState.OFFLINE).update(
            state=WorkerState.ONLINE
        )
    return worker


def worker_set_offline(*, name: str) -> None:
    """Mark a worker offline (it shut down cleanly)."""
    Worker.objects.filter(name=name).update(state=WorkerState.OFFLINE, current_run=None)


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
