"""Beat's safety net: the pass over every queue (runs a web process died before publishing,
messages the broker lost, runs on a queue nobody serves any more), and the reaper (runs of
workers that stopped heartbeating, expired leases)."""

from __future__ import annotations

import logging
import time
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps.fleet.models import WorkerState
from apps.fleet.routing import RunCannotFit
from apps.fleet.selectors import queue_for, workers_live
from apps.runs.dispatch import dispatch_after_commit, queue_dispatch
from apps.runs.events import run_event_append
from apps.runs.models import Run, RunStatus
from apps.runs.services.cancel import run_stop_notify
from apps.runs.transitions import run_move
from apps.runs.wire import run_done_payload

log = logging.getLogger(__name__)


def runs_dispatch() -> int:
    """The safety-net pass: reroute orphans, then dispatch every queue with waiting runs."""
    _reroute_orphans()
    return sum(queue_dispatch(queue) for queue in _queues_waiting())


def _queues_waiting() -> list[str]:
    """Queues with queued runs (a loose index scan: one probe per queue, not per run)."""
    with connection.cursor() as cursor:
        cursor.execute(f"""
            WITH RECURSIVE qs AS (
                (SELECT queue FROM runs_run WHERE status = '{RunStatus.QUEUED}'
                 ORDER BY queue LIMIT 1)
              UNION ALL
                SELECT (SELECT r.queue FROM runs_run r WHERE r.status = '{RunStatus.QUEUED}'
                          AND r.queue > qs.queue ORDER BY r.queue LIMIT 1)
                FROM qs WHERE qs.queue IS NOT NULL
            ) SELECT queue FROM qs WHERE queue IS NOT NULL""")
        return [row[0] for row in cursor.fetchall()]


REROUTE_SETTLE_S = 10.0  # after the fleet changes, every pass looks for orphans this long
REROUTE_FULL_EVERY_S = 60.0  # and one pass looks at least this often, whatever the fleet does
_reroute: dict[str, Any] = {"fleet": None, "changed": float("-inf"), "looked": float("-inf")}


def reroute_forget() -> None:
    """Make the next reroute pass look at the fleet again (tests)."""
    _reroute.update(fleet=None, changed=float("-inf"), looked=float("-inf"))


def _reroute_orphans() -> None:
    """Move queued runs off queues that no live worker serves, when another queue now fits.

    The queue is chosen at submit; workers come and go (drained, replaced, new GPU types), so a
    run must not wait forever on a queue nobody listens to. One `queue_for` per distinct
    requirement, one UPDATE per group.

    Finding those requirements reads every queued run of an unserved queue (6 ms per pass at
    10,000 queued, bench/dispatch.py's backlog), so a pass looks only when the answer can have
    changed: the live fleet (what `queue_for` reads) differs from the last look, or changed less
    than REROUTE_SETTLE_S ago (a submit routed by the old fleet may commit after the first
    look), or REROUTE_FULL_EVERY_S has passed. With the same fleet, a run submitted since was
    routed by that fleet already.
    """
    fleet = list(workers_live().order_by("name").values_list(
        "name", "incarnation", "state", "queues", "device", "model_files"))
    if not fleet:
        return  # no live worker at all: nothing better to choose, keep the submit-time choice
    now, seen = time.monotonic(), hash(repr(fleet))
    if seen != _reroute["fleet"]:
        _reroute.update(fleet=seen, changed=now)
    elif (now - _reroute["changed"] > REROUTE_SETTLE_S
          and now - _reroute["looked"] < REROUTE_FULL_EVERY_S):
        return
    _reroute["looked"] = now
    # A queue whose workers are all draining counts as unserved: its runs move to another pool
    # when one fits them (else they stay, and their wait reason says the pool is draining).
    served = {q for _, _, state, queues, _, _ in fleet if state != WorkerState.DRAINING
              for q in queues}
    orphans = (
        Run.objects.filter(status=RunStatus.QUEUED).exclude(queue__in=served)
        .values_list("queue", "requirement").distinct()
    )
    for queue, requirement in orphans.order_by()[:50]:
        try:
            better = queue_for(requirement)
        except RunCannotFit:
            continue  # its files' holders are too small now: it waits for a bigger worker
        if better != queue and better in served:
            Run.objects.filter(status=RunStatus.QUEUED, queue=queue,
                               requirement=requirement).update(queue=better, dispatched_at=None)


# --- the reaper -------------------------------------------------------------------------------

_LOST = f"""
SELECT r.id, r.lease_worker FROM runs_run r
WHERE r.status = '{RunStatus.RUNNING}' AND NOT EXISTS (
    SELECT 1 FROM fleet_worker w
    WHERE w.name || '#' || w.incarnation = r.lease_worker AND w.state <> '{WorkerState.OFFLINE}'
      AND w.last_heartbeat >= now() - make_interval(secs => %s))
LIMIT 200
"""


def runs_reap() -> int:
    """Requeue the runs of lost workers (no heartbeat for INLINE_WORKER_LOST_SECONDS) and runs
    whose lease expired; past INLINE_MAX_ATTEMPTS, fail them with the reason."""
    with connection.cursor() as cursor:
        cursor.execute(_LOST, [settings.INLINE_WORKER_LOST_SECONDS])
        lost = {str(run_id): worker for run_id, worker in cursor.fetchall()}
    expired = Run.objects.filter(status=RunStatus.RUNNING, lease_expires_at__lt=timezone.now())
    for run_id, worker in expired.values_list("pk", "lease_worker")[:200]:
        lost.setdefault(str(run_id), worker)
    return sum(_reap_one(run_id, worker) for run_id, worker in lost.items())


@transaction.atomic
def _reap_one(run_id: str, worker: str) -> int:
    run = (
        Run.objects.select_for_update(skip_locked=True)
        .filter(pk=run_id, status=RunStatus.RUNNING, lease_worker=worker).first()
    )
    if run is None:
        return 0
    name = worker.split("#", 1)[0] or "?"
    lost = (f"worker {name} stopped heartbeating and renewing its lease "
            f"(attempt {run.attempts})")
    fence = Run.objects.filter(pk=run.pk, attempts=run.attempts)
    run_stop_notify(run_id=run.pk)  # a worker that is only slow stops its stale attempt now
    if run.attempts >= settings.INLINE_MAX_ATTEMPTS:
        run_move(
            fence, source=[RunStatus.RUNNING], to=RunStatus.FAILED,
            finished_at=timezone.now(), lease_expires_at=None, error_code="worker_lost",
            error_message=f"{lost}; gave up after {run.attempts} attempts: each attempt lost "
                          "its worker (a run that kills its worker every time fails here)",
        )
        run_event_append(run_id=run.pk, type="run_done", payload=run_done_payload(run.pk))
    else:
        run_move(fence, source=[RunStatus.RUNNING], to=RunStatus.QUEUED,
                 lease_expires_at=None, dispatched_at=None)
        run_event_append(run_id=run.pk, type="status",
                         payload={"status": RunStatus.QUEUED, "reason": lost})
        dispatch_after_commit(run.queue)
    log.warning("reaped run %s: %s", run.pk, lost)
    return 1
