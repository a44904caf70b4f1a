"""One attempt of a run on this worker: claim, execute, record — or hand the run back.

`workers/tasks.py` calls `attempt_run` for each delivered run id, on one of the worker's slots
(Celery's threads pool: the slots share the process's loaded models, node cache and step
batchers, which is the point of slots). Database writes on this path retry across a dropped
connection; an attempt the infrastructure failed under is handed back to the queue, never
reported as the user's failure.
"""

from __future__ import annotations

import logging
import threading
import time

from django.conf import settings
from django.db import close_old_connections

from apps.runs.services import Claim, queue_take_next, run_claim, run_finish, run_hand_back
from workers import runtime
from workers.executor import CancelCheck, Outcome, execute
from workers.faults import db_retry, is_infrastructure_error
from workers.heartbeat import Presence
from workers.memory import meter

log = logging.getLogger(__name__)

HAND_BACK_PATIENCE_S = 120.0  # how long to keep trying to record an outcome while the DB is down
# How long a slot keeps taking the next run of its queue after its finishes (from the start of
# the run Celery delivered) before it goes back to Celery, whose next message may come from
# another of the worker's queues: a stream on one queue holds a slot away from the others'
# published runs for at most this long plus one run. Quick image runs (milliseconds) still
# chain by the hundred; on a GPU worker with second-long generations a slot keeps one or two.
SLOT_KEEP_SECONDS = 1.0


def attempt_run(run_id: str, me: Presence) -> str:
    """Execute run `run_id` once on this worker; a duplicate delivery is a no-op. Then, while
    runs of its queue wait, the slot keeps going with the next one, which its finish claimed
    (`_NextRun`)."""
    if me.stopping.is_set():
        return "not-claimed"  # stopping: the dispatcher publishes it again for another worker
    close_old_connections()
    try:
        claim = db_retry(lambda: run_claim(run_id=run_id, worker=me.lease_key))
    except Exception as exc:
        if not is_infrastructure_error(exc):
            raise
        log.warning("could not claim %s (%s); the dispatcher will publish it again", run_id, exc)
        return "not-claimed"
    status = "not-claimed"
    until = time.monotonic() + SLOT_KEEP_SECONDS
    try:
        while claim is not None:
            keep = _NextRun(me) if time.monotonic() < until else None
            status = _attempt(claim, me, keep)
            claim = keep.claim if keep is not None else None  # None: back to Celery
    finally:
        close_old_connections()
    return status


def _attempt(claim: Claim, me: Presence, keep: _NextRun | None) -> str:
    """Execute and record one claimed attempt; its status ("fault": handed back). With `keep`,
    its finish may claim the slot's next run (`keep.claim`)."""
    held = me.hold(claim.run_id, claim.attempt)
    memory = meter()
    memory.start(claim.run_id)
    try:
        try:
            outcome = execute(claim, cache=runtime.node_cache(), policy=runtime.policy(),
                              cancel=CancelCheck(claim, held.lost))
        finally:
            peak = memory.stop(claim.run_id)
        _record(claim, outcome, keep, peak)
        me.stats[f"runs_{outcome.status}"] += 1
        return outcome.status
    finally:
        me.release(claim.run_id)


class _NextRun:
    """Passed to `run_finish(next_run=…)`: inside the finish's transaction, claims the queue's
    next run for this slot (apps/runs/services/attempts.py `queue_take_next`), unless the worker is
    stopping. `claim` holds it once the finish returned; a finish that is retried starts over,
    so a rolled-back claim is never kept."""

    def __init__(self, me: Presence) -> None:
        self.me = me
        self.claim: Claim | None = None

    def __call__(self, queue: str) -> bool:
        if self.me.stopping.is_set():
            return False
        self.claim = queue_take_next(queue, worker=self.me.lease_key, name=self.me.name)
        return self.claim is not None


def _record(claim: Claim, outcome: Outcome, keep: _NextRun | None = None,
            peak_memory: int | None = None) -> None:
    if outcome.status == "cancelled":
        return  # no longer ours: whoever took it wrote its end (and dispatched its queue)
    if outcome.status == "fault":
        reason = f"worker fault, retrying: {(outcome.error or {}).get('message', '')}"
        _patiently(lambda: run_hand_back(run_id=claim.run_id, attempt=claim.attempt,
                                         reason=reason, fault=True))
        return

    def finish() -> bool:
        if keep is not None:
            keep.claim = None  # a try that failed may have claimed in its rolled-back transaction
        return run_finish(claim=claim, status=outcome.status, error=outcome.error,
                          events=outcome.events, takes=outcome.takes, next_run=keep,
                          peak_memory_bytes=peak_memory, values=outcome.values)

    _patiently(finish)


def _patiently(write: object) -> None:
    """Retry a fenced write until the database answers (a restart takes seconds). Past
    HAND_BACK_PATIENCE_S give up: the lease then expires and the reaper requeues the run."""
    assert callable(write)
    deadline = time.monotonic() + HAND_BACK_PATIENCE_S
    while True:
        try:
            db_retry(write)
            return
        except Exception as exc:
            if not is_infrastructure_error(exc) or time.monotonic() > deadline:
                raise
            log.warning("recording an outcome failed (%s); retrying", type(exc).__name__)
            time.sleep(1.0)


def hand_back_after_grace(me: Presence) -> threading.Thread:
    """SIGTERM: take no new run; runs still going after INLINE_WORKER_GRACE_SECONDS go back to
    the queue at once (no lease wait) and their executors stop at the next check."""
    me.stopping.set()

    def wait_then_hand_back() -> None:
        deadline = time.monotonic() + settings.INLINE_WORKER_GRACE_SECONDS
        while me.held() and time.monotonic() < deadline:
            time.sleep(0.1)
        for held in me.held():
            try:
                run_hand_back(run_id=held.run_id, attempt=held.attempt,
                              reason=f"worker {me.name} is stopping; handed back")
            except Exception:  # the lease and the reaper still cover it
                log.warning("could not hand back %s", held.run_id, exc_info=True)
            held.lost.set()

    thread = threading.Thread(target=wait_then_hand_back, name="hand-back", daemon=True)
    thread.start()
    return thread
