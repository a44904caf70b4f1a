"""The dispatcher and the reaper: where the farm's scheduling policy lives (not in the broker).

Runs wait in Postgres as `queued`. The dispatcher keeps at most INLINE_DISPATCH_WINDOW unclaimed
messages per queue, choosing by priority, then fair share (owners with the fewest running runs
first), then age. A message that was published but never claimed (lost by the broker, or held
by a dead worker's prefetch) is published again after INLINE_REDISPATCH_SECONDS.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count, IntegerField, OuterRef, Q, Subquery, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from apps.fleet.selectors import queue_for, workers_live
from apps.runs.events import run_event_append
from apps.runs.models import Run, RunStatus
from apps.runs.transitions import run_move
from apps.runs.wire import run_done_payload
from inline_farm.effects import publish_after_commit

log = logging.getLogger(__name__)

EXECUTE_TASK = "workers.tasks.execute_run"


def runs_dispatch() -> int:
    """Publish the next runs of every queue that has room; returns how many were published."""
    _reroute_orphans()
    queues = Run.objects.filter(status=RunStatus.QUEUED).values_list("queue", flat=True).distinct()
    return sum(_dispatch_queue(queue) for queue in queues)


def _reroute_orphans() -> None:
    """Move queued runs off queues that no live worker serves, when another queue now fits.

    The queue is chosen at submit; workers come and go (drained, replaced, new GPU types), so a
    run must not wait forever on a queue nobody listens to.
    """
    served = {q for queues in workers_live().values_list("queues", flat=True) for q in queues}
    if not served:
        return  # no live worker at all: nothing better to choose, keep the submit-time choice
    orphans = Run.objects.filter(status=RunStatus.QUEUED).exclude(queue__in=served)
    for run_id, requirement, queue in orphans.values_list("pk", "requirement", "queue")[:500]:
        better = queue_for(requirement)
        if better != queue and better in served:
            Run.objects.filter(pk=run_id, status=RunStatus.QUEUED, queue=queue).update(
                queue=better, dispatched_at=None
            )


@transaction.atomic
def _dispatch_queue(queue: str) -> int:
    now = timezone.now()
    fresh = now - timedelta(seconds=settings.INLINE_REDISPATCH_SECONDS)
    waiting = Run.objects.filter(status=RunStatus.QUEUED, queue=queue)
    outstanding = waiting.filter(dispatched_at__gte=fresh).count()
    room = settings.INLINE_DISPATCH_WINDOW - outstanding
    if room <= 0:
        return 0
    running_of_owner = (
        Run.objects.filter(owner=OuterRef("owner"), status=RunStatus.RUNNING)
        .values("owner").annotate(n=Count("pk")).values("n")
    )
    candidates = list(
        waiting.filter(Q(dispatched_at__isnull=True) | Q(dispatched_at__lt=fresh))
        .annotate(owner_running=Coalesce(Subquery(running_of_owner, output_field=IntegerField()),
                                         Value(0)))
        .order_by("-priority", "owner_running", "created_at")
        .select_for_update(skip_locked=True, of=("self",))
        .values_list("pk", flat=True)[:room]
    )
    Run.objects.filter(pk__in=candidates, status=RunStatus.QUEUED).update(dispatched_at=now)
    for run_id in candidates:
        publish_after_commit(EXECUTE_TASK, args=[str(run_id)], queue=queue)
    return len(candidates)


def runs_reap() -> int:
    """Requeue runs whose lease expired (worker lost); past INLINE_MAX_ATTEMPTS, fail them."""
    now = timezone.now()
    expired = Run.objects.filter(status=RunStatus.RUNNING, lease_expires_at__lt=now)
    reaped = 0
    for run_id in expired.values_list("pk", flat=True)[:200]:
        reaped += _reap_one(run_id, now)
    return reaped


@transaction.atomic
def _reap_one(run_id: Any, now: datetime) -> int:
    run = (
        Run.objects.select_for_update(skip_locked=True)
        .filter(pk=run_id, status=RunStatus.RUNNING, lease_expires_at__lt=now).first()
    )
    if run is None:
        return 0
    lost = f"worker {run.lease_worker or '?'} stopped renewing its lease (attempt {run.attempts})"
    if run.attempts >= settings.INLINE_MAX_ATTEMPTS:
        run_move(
            Run.objects.filter(pk=run.pk), source=[RunStatus.RUNNING], to=RunStatus.FAILED,
            finished_at=timezone.now(), lease_expires_at=None,
            error_code="worker_lost",
            error_message=f"{lost}; gave up after {run.attempts} attempts",
        )
        run_event_append(run_id=run.pk, type="run_done", payload=run_done_payload(run.pk))
    else:
        run_move(
            Run.objects.filter(pk=run.pk), source=[RunStatus.RUNNING], to=RunStatus.QUEUED,
            lease_expires_at=None, dispatched_at=None,
        )
        run_event_append(run_id=run.pk, type="status",
                         payload={"status": RunStatus.QUEUED, "reason": lost})
    log.warning("reaped run %s: %s", run.pk, lost)
    return 1
