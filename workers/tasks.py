"""Celery tasks of the GPU side. Thin: claim, execute, record — the logic lives elsewhere."""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task
from celery.signals import celeryd_after_setup, worker_ready, worker_shutdown
from django.db import close_old_connections

log = logging.getLogger(__name__)

_heartbeat: list[Any] = []


@shared_task(name="workers.tasks.execute_run", ignore_result=True)
def execute_run(run_id: str) -> str:
    """Execute run `run_id` once. A duplicate delivery (already claimed or ended) is a no-op."""
    from apps.runs.services import run_claim, run_finish
    from workers import runtime
    from workers.executor import CancelCheck, execute
    from workers.heartbeat import current_run_set
    from workers.lease import LeaseKeeper

    close_old_connections()
    claim = run_claim(run_id=run_id, worker=execute_run.request.hostname or "worker")
    if claim is None:
        return "not-claimed"
    cancel = CancelCheck(claim)
    current_run_set(claim.run_id)
    try:
        with LeaseKeeper(claim, cancel.lost):
            outcome = execute(claim, cache=runtime.node_cache(), policy=runtime.policy(),
                              cancel=cancel)
        if outcome.status != "cancelled":
            run_finish(run_id=claim.run_id, attempt=claim.attempt, status=outcome.status,
                       error=outcome.error)
    finally:
        current_run_set(None)
        close_old_connections()
    return outcome.status


@celeryd_after_setup.connect
def _serve_capability_queue(sender: str, instance: Any, **_: Any) -> None:
    """A GPU worker also consumes its `gpu.<N>g` queue, decided by its own device policy."""
    from django.conf import settings

    from apps.fleet.capability import gpu_queue_for_vram
    from workers import runtime

    if not _executes_runs(instance.app.amqp.queues.consume_from or {}):
        return  # the control worker: no device, no torch
    device = runtime.policy().describe()
    queue = gpu_queue_for_vram(device["vram_gb"]) if device["profile"] != "cpu" else None
    if queue and settings.INLINE_AUTO_GPU_QUEUE:
        instance.app.amqp.queues.select_add(queue)
        log.info("worker %s also serves %s (%s GB usable)", sender, queue, device["vram_gb"])


@worker_ready.connect
def _start_heartbeat(sender: Any = None, **_: Any) -> None:
    from workers.heartbeat import Heartbeat

    queues = sorted(q.name for q in sender.task_consumer.queues)
    if not _executes_runs(queues):
        return  # the control worker runs beat's passes; it is not part of the render fleet
    heartbeat = Heartbeat(sender.hostname, queues)
    heartbeat.start()
    _heartbeat.append(heartbeat)
    log.info("worker %s serving %s", sender.hostname, ", ".join(queues))


def _executes_runs(queues: Any) -> bool:
    return any(q != "control" for q in queues)


@worker_shutdown.connect
def _stop_heartbeat(**_: Any) -> None:
    for heartbeat in _heartbeat:
        heartbeat.stop()
