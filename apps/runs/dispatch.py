"""The dispatcher and the reaper: where the farm's scheduling policy lives (not in the broker).

Runs wait in Postgres as `queued`. A queue gets messages only for free slots: its window is
the slots of the live, non-draining workers serving it (+ INLINE_DISPATCH_WINDOW), less its
running runs, less its published-but-unclaimed ones. The next runs are chosen by priority,
then the team's fair share (fewest running per unit of Team.weight), then the owner's (fewest
running), then age.

Cost: `queue_dispatch` runs after the commit of every submit, finish, cancel and requeue, and
reads only what it selects — one probe per owner waiting in the queue (a loose index scan),
never one per queued run — so it stays flat as the queue grows. Passes over one queue mark
runs one at a time (an advisory lock), so concurrent passes never overfill the window; the
lock is taken only inside the one statement that counts and marks (`_pass`), never in a
submit's or a finish's transaction. While every slot is taken no pass takes it: a slot that
finishes either takes its next run in its finish's transaction (`queue_take_next`: the slot is
never free, so nothing changes for anyone else) or dispatches after its commit.

Safety net (beat, every INLINE_REAPER_INTERVAL): `runs_dispatch` passes over every queue, so a
run whose web process died between commit and publish, or whose message the broker lost, is
published again within INLINE_REDISPATCH_SECONDS; `runs_reap` requeues the runs of workers that
stopped heartbeating (INLINE_WORKER_LOST_SECONDS) and of expired leases.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps.fleet.models import WorkerState
from apps.fleet.routing import RunCannotFit
from apps.fleet.selectors import queue_for, workers_live
from apps.runs.events import run_event_append
from apps.runs.models import Run, RunStatus
from apps.runs.services import (
    LOCK_QUEUE_DISPATCH,
    Claim,
    dispatch_after_commit,
    run_claim_next,
    run_stop_notify,
)
from apps.runs.transitions import run_move
from apps.runs.wire import run_done_payload
from inline_farm.effects import publish_after_commit

log = logging.getLogger(__name__)

EXECUTE_TASK = "workers.tasks.execute_run"
CAPACITY_TTL_S = 1.0  # how long one process trusts its reading of the fleet's slots
NEXT_CANDIDATES = 4  # runs a finishing slot tries, in order, for its next (`queue_take_next`)


# --- dispatch ---------------------------------------------------------------------------------

def queue_dispatch(queue: str) -> int:
    """Publish the next runs of `queue` into its free slots; returns how many were published.
    Call after the commit that made runs eligible or freed slots (a submit, finish, requeue)."""
    window = _queue_capacity(queue)
    if window <= 0:
        return 0  # nobody serves it: publish nothing (the pass reroutes or waits for a worker)
    return _pass(queue, window)


def queue_take_next(queue: str, *, worker: str, name: str) -> Claim | None:
    """Inside the transaction that finishes a run of `queue` on a slot of `worker` (lease key;
    `name`: its fleet row), after the finish's writes: claim the queue's next run for that slot
    (`run_finish(next_run=…)`, workers/attempt.py). None when nothing is eligible, the queue's
    window is full without that slot, or the worker is no longer online (a drained worker takes
    no new run): the finish then dispatches after commit as any other.

    The finished run and the next one change places in one commit, so the slot is never free in
    between: the queue's busy count is the same before and after, and no pass — the web's after
    a submit, another slot's — sees a slot to fill or needs the dispatch lock for it. Sent as a
    message, the next run would travel LPUSH → BRPOP → Celery's consumer → a free slot, and the
    free slot is this one: in a burst of quick runs that cost the worker more CPU than the run's
    graph (bench/hotpath.py under py-spy), and the claim was one more durable commit. The
    choice is the policy's (`_heads`, `_pick`), read in this transaction after the finish's
    writes, as if the slot were free already. Should more slots be free than this one, the
    queue is dispatched after commit too."""
    window = _queue_capacity(queue)
    if window <= 0:
        return None
    fresh = _fresh()
    heads = _heads(queue, fresh, window)
    if not heads:
        return None
    # a few in the policy's order: one another slot or pass is taking meanwhile is skipped
    claim = run_claim_next(candidates=_pick(heads, NEXT_CANDIDATES), queue=queue,
                           fresh=fresh, worker=worker, name=name)
    if claim is not None and window - heads[0][-1] > 1:
        dispatch_after_commit(queue)  # the other free slots
    return claim


# The locked part of a pass is one statement on the server (migrations/runs/0003: the queue's
# dispatch lock, its busy count read afresh, the marks), so the lock is never held across a
# round trip to this process. The policy's order is computed before it, from an unlocked read:
# up to a window's worth of candidates, of which the function marks the first still eligible
# up to the free slots it counts under the lock. A candidate another pass took meanwhile is
# busy now and skipped; a slot freed meanwhile is dispatched by whoever freed it, after their
# commit; beat's pass (every INLINE_REAPER_INTERVAL) covers anything else.
_MARK = "SELECT id FROM inline_dispatch_mark(%s, %s, %s, %s, %s, %s::uuid[], %s) AS id"


def _pass(queue: str, window: int) -> int:
    """Pick the queue's next runs into its free slots and mark them published; their messages go
    out after commit. Returns how many."""
    fresh = _fresh()
    heads = _heads(queue, fresh, window)
    if not heads:
        # Nothing waits (the common case after a finish), or every slot is taken: whoever
        # frees one dispatches after their commit, and sees every run committed before it.
        return 0
    candidates = _pick(heads, window)
    with connection.cursor() as cursor:
        cursor.execute(_MARK, [LOCK_QUEUE_DISPATCH, queue_lock_key(queue), queue, fresh, window,
                               candidates, not connection.in_atomic_block])
        published = [str(row[0]) for row in cursor.fetchall()]  # in the order picked
    for run_id in published:
        publish_after_commit(EXECUTE_TASK, args=[run_id], queue=queue)
    return len(published)


def runs_dispatch() -> int:
    """The safety-net pass: reroute orphans, then dispatch every queue with waiting runs."""
    _reroute_orphans()
    return sum(queue_dispatch(queue) for queue in _queues_waiting())


# The queue's busy count (running + published and not yet claimed), then — only while that
# leaves a slot free — per owner waiting in the queue (a loose index scan over
# run_queued_heads), their next `window` eligible runs and how many runs they have running: what
# fair share needs, and no more. No rows when nothing is eligible or every slot is taken; a full
# queue costs two index probes, as the separate probe before it did (now folded in: one round
# trip less per pass). Read without the dispatch lock; the marking function counts again under
# it. Every lookup has an index whose order or predicate fits it, so its plan stays flat in
# queue depth whatever the queue; bench/dispatch.py measures it.
_HEADS = f"""
WITH RECURSIVE busy AS (
    SELECT (SELECT count(*) FROM runs_run WHERE status = '{RunStatus.RUNNING}' AND queue = %(q)s)
         + (SELECT count(*) FROM runs_run WHERE status = '{RunStatus.QUEUED}' AND queue = %(q)s
              AND dispatched_at >= %(fresh)s) AS n
), owners AS (
    (SELECT owner_id FROM runs_run WHERE status = '{RunStatus.QUEUED}' AND queue = %(q)s
       AND (SELECT n FROM busy) < %(window)s
     ORDER BY owner_id LIMIT 1)
  UNION ALL
    SELECT (SELECT r.owner_id FROM runs_run r WHERE r.status = '{RunStatus.QUEUED}' AND r.queue = %(q)s
              AND r.owner_id > owners.owner_id ORDER BY r.owner_id LIMIT 1)
    FROM owners WHERE owners.owner_id IS NOT NULL
)
SELECT head.id, owners.owner_id, head.priority, head.created_at,
       (SELECT count(*) FROM runs_run x WHERE x.status = '{RunStatus.RUNNING}'
          AND x.owner_id = owners.owner_id) AS owner_running,
       team.id AS team_id, COALESCE(team.weight, 1) AS team_weight,
       (SELECT count(*) FROM runs_run x JOIN accounts_team_members m ON m.user_id = x.owner_id
         WHERE x.status = '{RunStatus.RUNNING}' AND m.team_id = team.id) AS team_running,
       (SELECT n FROM busy) AS busy
FROM owners
LEFT JOIN LATERAL (  -- the owner's share: their first team (none: they share alone)
    SELECT t.id, t.weight FROM accounts_team t
    WHERE t.id = (SELECT min(tm.team_id) FROM accounts_team_members tm
                  WHERE tm.user_id = owners.owner_id)
) team ON true
CROSS JOIN LATERAL (
    SELECT q.id, q.priority, q.created_at FROM runs_run q
    WHERE q.status = '{RunStatus.QUEUED}' AND q.queue = %(q)s AND q.owner_id = owners.owner_id
      AND (q.dispatched_at IS NULL OR q.dispatched_at < %(fresh)s)
    ORDER BY q.priority DESC, q.created_at LIMIT %(window)s
) head
WHERE owners.owner_id IS NOT NULL
"""


def _heads(queue: str, fresh: Any, window: int) -> list[tuple[Any, ...]]:
    """Each waiting owner's next eligible runs, with their and their team's running counts (and,
    last, the queue's busy count), in one round trip; none when nothing is eligible or the
    queue's `window` is full."""
    with connection.cursor() as cursor:
        cursor.execute(_HEADS, {"q": queue, "fresh": fresh, "window": window})
        return list(cursor.fetchall())


def _fresh() -> Any:
    """Published before this and not claimed: the message counts as lost (a run is eligible
    again, and no longer busy)."""
    return timezone.now() - timedelta(seconds=settings.INLINE_REDISPATCH_SECONDS)


def _pick(heads: list[tuple[Any, ...]], room: int) -> list[str]:
    """Choose up to `room` runs: highest priority first; then the share (the owner's team, or
    the owner alone) with the fewest running runs per unit of weight; then the owner with the
    fewest running; then the oldest. Each pick counts as running, so free slots go round.
    `heads` holds each owner's next runs in order, with their owner's and team's counts."""
    waiting: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
    running: dict[int, int] = {}
    share_of: dict[int, tuple[str, int]] = {}
    share_running: dict[tuple[str, int], int] = {}
    weight: dict[tuple[str, int], int] = {}
    for run_id, owner, priority, created, owner_running, team, team_weight, team_running, _ in heads:
        waiting[owner].append((run_id, priority, created))
        running[owner] = int(owner_running)
        share = ("team", team) if team is not None else ("user", owner)
        share_of[owner] = share
        share_running[share] = int(team_running if team is not None else owner_running)
        weight[share] = max(int(team_weight), 1)

    def order(o: int) -> tuple[Any, ...]:
        share = share_of[o]
        return (-waiting[o][0][1], share_running[share] / weight[share], running[o],
                waiting[o][0][2])

    chosen: list[str] = []
    while len(chosen) < room and waiting:
        owner = min(waiting, key=order)
        chosen.append(str(waiting[owner].pop(0)[0]))
        running[owner] += 1
        share_running[share_of[owner]] += 1
        if not waiting[owner]:
            del waiting[owner]
    return chosen


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


def queue_lock_key(queue: str) -> int:
    """A stable int4 for a queue name: the second key of its dispatch lock (the first is
    LOCK_QUEUE_DISPATCH)."""
    import zlib

    return zlib.crc32(queue.encode()) - 2**31


_capacity: dict[str, Any] = {"at": float("-inf"), "slots": {}}


def _queue_capacity(queue: str) -> int:
    """Free-slot window of `queue`: slots of live, non-draining workers serving it, plus
    INLINE_DISPATCH_WINDOW; 0 when none serves it. Read at most once a second per process."""
    now = time.monotonic()
    if now - _capacity["at"] > CAPACITY_TTL_S:
        slots: dict[str, int] = defaultdict(int)
        for queues, n in workers_live().exclude(state=WorkerState.DRAINING).values_list(
            "queues", "slots"
        ):
            for q in queues:
                slots[q] += max(int(n), 1)
        _capacity.update(at=now, slots=slots)
    served = _capacity["slots"].get(queue, 0)
    return served + settings.INLINE_DISPATCH_WINDOW if served else 0


def capacity_forget() -> None:
    """Make the next dispatch and the next reroute pass read the fleet again (tests)."""
    _capacity["at"] = float("-inf")
    _reroute.update(fleet=None, changed=float("-inf"), looked=float("-inf"))


REROUTE_SETTLE_S = 10.0  # after the fleet changes, every pass looks for orphans this long
REROUTE_FULL_EVERY_S = 60.0  # and one pass looks at least this often, whatever the fleet does
_reroute: dict[str, Any] = {"fleet": None, "changed": float("-inf"), "looked": float("-inf")}


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
