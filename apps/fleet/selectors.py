"""Reads on the fleet: who is alive, what model files the fleet holds, where a run can go."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any, NamedTuple

from django.conf import settings
from django.db import connection
from django.db.models import QuerySet
from django.utils import timezone

from apps.fleet.models import Worker, WorkerState


def workers_live() -> QuerySet[Worker]:
    """Workers that heartbeated within INLINE_WORKER_LOST_SECONDS and have not shut down."""
    horizon = timezone.now() - timedelta(seconds=settings.INLINE_WORKER_LOST_SECONDS)
    return Worker.objects.filter(last_heartbeat__gte=horizon).exclude(state=WorkerState.OFFLINE)


# `workers_live()`'s rows, as the fleet's own `_SERVING_OF` reads them (the server's clock).
_LIVE = """
SELECT w.name, w.queues, w.device, w.model_files, w.state FROM fleet_worker w
WHERE w.last_heartbeat >= now() - make_interval(secs => %(lost)s) AND w.state <> %(offline)s
"""


def _json(value: Any) -> Any:
    """A jsonb column as Django's connection returns it (text: JSONField decodes it) decoded."""
    return json.loads(value) if isinstance(value, str | bytes) else value


class LiveFleet:
    """One read of the live workers (`workers_live`), and what a submit asks of them: the model
    catalog, the files' sizes, the queue a requirement routes to. A model graph's submit asks
    all three; reading the fleet once for them saves three round trips (they were four queries
    of the same rows), and the three answers then agree with each other."""

    def __init__(self) -> None:
        with connection.cursor() as cursor:  # written out: the ORM's query building was most of it
            cursor.execute(_LIVE, serving_params())
            self.workers = [LiveWorker(name, _json(queues), _json(device), _json(files), state)
                            for name, queues, device, files, state in cursor.fetchall()]

    def catalog(self) -> dict[str, list[str]]:
        """Models dir folder → sorted model names held by at least one live worker."""
        catalog: dict[str, set[str]] = {}
        for worker in self.workers:
            for entry in worker.model_files:
                catalog.setdefault(entry["folder"], set()).add(entry["name"])
        return {folder: sorted(names) for folder, names in sorted(catalog.items())}

    def sizes(self) -> dict[tuple[str, str], int]:
        """(folder, name) → size in bytes, for the model files live workers hold."""
        return {(entry["folder"], entry["name"]): int(entry.get("size") or 0)
                for worker in self.workers for entry in worker.model_files}

    def queue_for(self, requirement: dict[str, Any]) -> str:
        """The capability queue a run with `requirement` should go to (apps/fleet/routing.py):
        the smallest live GPU class that fits its memory estimate and holds its model files,
        else `cpu` when a CPU worker holds them, else `gpu` (waits for a capable worker).
        Raises RunCannotFit when the workers holding the files could never fit the run."""
        from apps.fleet.routing import route

        if not requirement.get("models"):
            return "cpu"
        return route(requirement, self.workers)


class LiveWorker(NamedTuple):
    """What routing reads of a live worker."""

    name: str
    queues: list[str]
    device: dict[str, Any]
    model_files: list[dict[str, Any]]
    state: str


def model_catalog() -> dict[str, list[str]]:
    """Models dir folder → sorted model names held by at least one live worker."""
    return LiveFleet().catalog()


def model_catalog_families() -> tuple[dict[str, list[str]],
                                      dict[tuple[str, str], tuple[str, ...]]]:
    """`model_catalog()`, and the families each held file's contents belong to (what the
    importer needs), from one read of the fleet."""
    fleet = LiveFleet()
    families: dict[tuple[str, str], tuple[str, ...]] = {}
    for worker in fleet.workers:
        for entry in worker.model_files:
            families.setdefault((entry["folder"], entry["name"]),
                                tuple(entry.get("families") or ()))
    return fleet.catalog(), families


def queue_for(requirement: dict[str, Any]) -> str:
    """`LiveFleet.queue_for` on the fleet as it is now (no read when no model is needed)."""
    if not requirement.get("models"):
        return "cpu"
    return LiveFleet().queue_for(requirement)


# A poll of a queued run says why it waits. The workers serving a queue, as one scalar: a JSON
# array of [state, slots, running] (text), for the queue that `queue_sql` names. The run read that
# polls make (apps/runs/selectors.py RUN_VISIBLE) carries it for a queued run, so such a poll is
# one statement; `queue_wait_reasons` reads it for several queues at once.
_SERVING_OF = """
(SELECT coalesce(json_agg(json_build_array(w.state, w.slots,
        CASE jsonb_typeof(w.running) WHEN 'array' THEN jsonb_array_length(w.running) ELSE 0 END)),
    '[]')::text
 FROM fleet_worker w
 WHERE w.last_heartbeat >= now() - make_interval(secs => %(lost)s) AND w.state <> %(offline)s
   AND w.queues ? {queue})
"""


def serving_of(queue_sql: str) -> str:
    """SQL: the live workers serving the queue named by the expression `queue_sql`, as
    `queue_wait_reason` reads them; its parameters are `serving_params()`."""
    return _SERVING_OF.format(queue=queue_sql)


def serving_params() -> dict[str, Any]:
    return {"lost": settings.INLINE_WORKER_LOST_SECONDS, "offline": WorkerState.OFFLINE}


_SERVING = f"SELECT q, {serving_of('q')} FROM unnest(%(queues)s::text[]) q"


def queue_wait_reasons(queues: set[str], cursor: Any = None) -> dict[str, str]:
    """Why runs queued on each of `queues` are waiting, in words (one query for all), read on
    `cursor` or else on Django's connection."""

    if cursor is None:
        with connection.cursor() as cursor:
            return queue_wait_reasons(queues, cursor)
    cursor.execute(_SERVING, {**serving_params(), "queues": sorted(queues)})
    return {queue: queue_wait_reason(queue, serving) for queue, serving in cursor.fetchall()}


def queue_wait_reason(queue: str, serving: str) -> str:
    """Why a run queued on `queue` waits, from `serving_of`'s value for that queue."""
    workers = json.loads(serving)
    online = [(slots, running) for state, slots, running in workers
              if state != WorkerState.DRAINING]
    if not workers:
        return f"no live worker serves {queue}; it waits for one to join"
    if not online:
        return f"every worker serving {queue} is draining; it waits for a resume"
    busy = sum(running for _, running in online)
    slots = sum(n for n, _ in online)
    return f"waiting for a free slot on {queue} ({busy} of {slots} busy)"
