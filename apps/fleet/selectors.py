"""Reads on the fleet: who is alive, what model files the fleet holds, where a run can go."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import QuerySet
from django.utils import timezone

from apps.fleet.models import Worker, WorkerState


def workers_live() -> QuerySet[Worker]:
    """Workers that heartbeated within INLINE_WORKER_LOST_SECONDS and have not shut down."""
    horizon = timezone.now() - timedelta(seconds=settings.INLINE_WORKER_LOST_SECONDS)
    return Worker.objects.filter(last_heartbeat__gte=horizon).exclude(state=WorkerState.OFFLINE)


def model_catalog() -> dict[str, list[str]]:
    """Models dir folder → sorted model names held by at least one live worker."""
    catalog: dict[str, set[str]] = {}
    for files in workers_live().values_list("model_files", flat=True):
        for entry in files:
            catalog.setdefault(entry["folder"], set()).add(entry["name"])
    return {folder: sorted(names) for folder, names in sorted(catalog.items())}


def queue_for(requirement: dict[str, Any]) -> str:
    """The capability queue a run with `requirement` should go to.

    Pillow-only graphs go to `cpu`. Model graphs go to the smallest `gpu.<N>g` queue served by a
    live worker holding every model file they name, else to `cpu` when a live CPU worker holds
    them (slow, but correct), else to `gpu` (waits for a capable worker to appear).
    """
    if not requirement.get("models"):
        return "cpu"
    needed = {(m["folder"], m["name"]) for m in requirement["models"]}
    queues: set[str] = set()
    for worker in workers_live().exclude(state=WorkerState.DRAINING):
        held = {(m["folder"], m["name"]) for m in worker.model_files}
        if needed <= held:
            queues.update(q for q in worker.queues if q.startswith("gpu.") or q == "cpu")
    gpu = sorted((q for q in queues if q.startswith("gpu.")), key=_vram_of_queue)
    if gpu:
        return gpu[0]
    return "cpu" if "cpu" in queues else "gpu"


def _vram_of_queue(queue: str) -> float:
    try:
        return float(queue.removeprefix("gpu.").rstrip("g"))
    except ValueError:
        return float("inf")
