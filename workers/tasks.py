"""Celery tasks and signals of the GPU side. Thin: the logic lives in workers/attempt.py."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from celery import shared_task
from celery.signals import celeryd_after_setup, worker_ready, worker_shutdown, worker_shutting_down

log = logging.getLogger(__name__)

_config: dict[str, Any] = {}
_presence_lock = threading.Lock()


@shared_task(name="workers.tasks.execute_run", ignore_result=True)
def execute_run(run_id: str) -> str:
    """Execute run `run_id` once. A duplicate delivery (already claimed or ended) is a no-op."""
    from workers.attempt import attempt_run

    return attempt_run(run_id, _ensure_presence(execute_run.request.hostname or "worker"))


def _ensure_presence(hostname: str) -> Any:
    from workers.heartbeat import presence, presence_start

    with _presence_lock:
        me = presence()
        if me is None:  # the first beat failed at start (database down): beat now
            me = presence_start(_config.get("name", hostname), _config.get("queues", ["cpu"]),
                                _config.get("slots", 1))
            me.start()
        return me


@celeryd_after_setup.connect
def _serve_capability_queue(sender: str, instance: Any, **_: Any) -> None:
    """A GPU worker also consumes its `gpu.<N>g` queue; then the worker beats once, before it
    takes any task, so the farm knows this process (its incarnation) before its first claim."""
    from django.conf import settings

    from apps.fleet.capability import gpu_queue_for_vram
    from workers import runtime
    from workers.heartbeat import offline_if_terminated_during_startup, presence_start

    queues = instance.app.amqp.queues
    if not _executes_runs(queues.consume_from or {}):
        return  # the control worker: no device, no torch
    _checkout_without_ping()
    _lower_cpu_priority(settings.INLINE_WORKER_NICE)
    device = runtime.policy().describe()
    queue = gpu_queue_for_vram(device["vram_gb"]) if device["profile"] != "cpu" else None
    if queue and settings.INLINE_AUTO_GPU_QUEUE:
        queues.select_add(queue)
        log.info("worker %s also serves %s (%s GB usable)", sender, queue, device["vram_gb"])
    names = sorted(queues.consume_from or {})
    _config.update(name=sender, queues=names, slots=int(instance.concurrency or 1))
    with _presence_lock:
        presence_start(sender, names, _config["slots"])
    offline_if_terminated_during_startup()


def _checkout_without_ping() -> None:
    """A run worker's pooled connections leave the pool without psycopg's ping.

    The ping (CONN_HEALTH_CHECKS) was a round trip before every attempt's claim, on the path
    from submit to done: 0.5–1.2 ms on a busy 2-core box (bench/timeline.py). Here it buys
    nothing: every database call of an attempt (claim, cancel check, flush, finish, hand-back)
    goes through `db_retry`, which on a dead connection (a terminated session, a restarted
    server) closes it and repeats the fenced call on a fresh one, and a failure inside a node
    is a worker fault, retried (workers/faults.py). The web keeps psycopg's ping: a request there is not
    repeated. Runs before the process's first connection (the pool reads this when made).
    """
    from django.db import connection

    connection.settings_dict["CONN_HEALTH_CHECKS"] = False
    connection.close_pool()  # type: ignore[attr-defined]  # Django 5.1+; none yet; were there one, it would have been made with the check


def _lower_cpu_priority(increment: int) -> None:
    """Yield the CPU to the control plane on a shared machine.

    Where web, broker, database and workers share cores (`./farm up`, a small box), a worker
    busy rendering held the web process off the CPU: under an 8-user flood `/v1/health`'s p99
    went past 100 ms. A nice increment lets the API, the dispatcher and the reaper (the control
    worker keeps priority 0) go first; alone on its machine a worker loses nothing by it.
    """
    if increment > 0:
        os.nice(increment)


@worker_ready.connect
def _start_heartbeat(**_: Any) -> None:
    from inline_farm.heap import freeze_long_lived
    from workers.heartbeat import presence

    freeze_long_lived("worker")  # before any run: Celery, Django, torch (inline_farm/heap.py)
    me = presence()
    if me is not None:
        me.start()
        log.info("worker %s serving %s with %d slots", me.name, ", ".join(me.queues), me.slots)


def _executes_runs(queues: Any) -> bool:
    return any(q != "control" for q in queues)


@worker_shutting_down.connect
def _stop_taking_runs(**_: Any) -> None:
    from workers.attempt import hand_back_after_grace
    from workers.heartbeat import presence

    me = presence()
    if me is not None:
        hand_back_after_grace(me)


@worker_shutdown.connect
def _stop_heartbeat(**_: Any) -> None:
    from workers.heartbeat import presence

    me = presence()
    if me is not None:
        me.stop()
