"""The dispatcher: where the farm's scheduling policy lives (not in the broker).

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

Beat's safety net (every pass over every queue, rerouting, the reaper) is apps/runs/recovery.py.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps.fleet.models import WorkerState
from apps.fleet.selectors import workers_live
from apps.runs.models import RunStatus
from inline_farm.effects import publish_after_commit

log = logging.getLogger(__name__)

EXECUTE_TASK = "workers.tasks.execute_run"
CAPACITY_TTL_S = 1.0  # how long one process trusts its reading of the fleet's slots
LOCK_QUEUE_DISPATCH = 2  # the queues' advisory-lock namespace (pg_advisory_xact_lock(2, key))


# --- dispatch ---------------------------------------------------------------------------------

def queue_dispatch(queue: str) -> int:
    """Publish the next runs of `queue` into its free slots; returns how many were published.
    Call after the commit that made runs eligible or freed slots (a submit, finish, requeue)."""
    window = _queue_capacity(queue)
    if window <= 0:
        return 0  # nobody serves it: publish nothing (the pass reroutes or waits for a worker)
    return _pass(queue, window)


def dispatch_after_commit(queue: str) -> None:
    """Dispatch `queue` once the current transaction commits (a submit, finish, cancel or
    requeue: the queue's lock is taken only in a statement of its own, never in such a
    transaction). Robust: what was committed stands, so a pass that fails (the database gone a
    moment) is logged, not raised into the caller — a submit still answers 201 — and beat's pass
    publishes what waits within INLINE_REDISPATCH_SECONDS, as it does for a process that died
    in between."""
    transaction.on_commit(lambda: queue_dispatch(queue), robust=True)


@dataclass(frozen=True)
class NextPicks:
    """The policy's next runs of a queue for a slot about to free up (`queue_next_picks`)."""

    candidates: list[str]  # in the policy's order
    fresh: Any  # published before this and not claimed: eligible again
    others_free: bool  # more slots than the one are free: dispatch after commit too


def queue_next_picks(queue: str, room: int) -> NextPicks | None:
    """Up to `room` runs of `queue` in the policy's order, read as if one more slot were free
    (a finishing slot's next run: apps/runs/services/attempts.py `queue_take_next`); None when
    nobody serves the queue, nothing is eligible or its window is full without that slot."""
    window = _queue_capacity(queue)
    if window <= 0:
        return None
    fresh = _fresh()
    heads = _heads(queue, fresh, window)
    if not heads:
        return None
    return NextPicks(_pick(heads, room), fresh, window - heads[0][-1] > 1)


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
    """Make the next dispatch read the fleet again (tests)."""
    _capacity["at"] = float("-inf")
