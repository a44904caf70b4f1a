"""A worker's attempt at a run, as the database sees it: the claim (compare-and-set and lease),
event and take flushes, the finish (and the slot's next claim in the same commit), the
hand-back, and lease renewals. Every write is fenced by the attempt."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from apps.fleet.models import WorkerState
from apps.runs.dispatch import dispatch_after_commit, queue_next_picks
from apps.runs.events import (
    events_insert,
    run_event_append,
    run_events_append_fenced,
    run_group,
    run_seqs_reserve,
)
from apps.runs.models import Run, RunStatus
from apps.runs.transitions import edge_check, run_move
from apps.takes.models import Take
from apps.takes.services import TakeDraft, takes_insert, takes_keep
from apps.takes.wire import take_to_wire
from inline_farm.effects import group_send_after_commit
from inline_farm.ids import is_uuid

NEXT_CANDIDATES = 4  # runs a finishing slot tries, in order, for its next (`queue_take_next`)


@dataclass(frozen=True)
class Claim:
    """A worker's hold on one attempt of a run; every later write is fenced by `attempt`."""

    run_id: str
    attempt: int
    owner_id: int
    target: str
    graph_sha256: str
    document: dict[str, Any]
    queue: str = "cpu"


_CLAIM = f"""
WITH claimed AS (
    UPDATE runs_run AS r
    SET status = '{RunStatus.RUNNING}', attempts = r.attempts + 1, lease_worker = %(worker)s,
        lease_expires_at = now() + make_interval(secs => %(lease)s),
        started_at = COALESCE(r.started_at, now()), dispatched_at = NULL,
        last_seq = r.last_seq + 1
    FROM graphs_graph AS g
    WHERE r.id = {{which}} AND r.status = '{RunStatus.QUEUED}' AND g.id = r.graph_id{{also}}
    RETURNING r.id, r.attempts, r.owner_id, r.target, r.queue, r.last_seq, g.sha256, g.document
), logged AS (
    INSERT INTO runs_runevent (run_id, seq, type, payload, created_at)
    SELECT id, last_seq, 'status', jsonb_build_object(
        'status', '{RunStatus.RUNNING}', 'attempt', attempts, 'worker', %(worker)s::text), now()
    FROM claimed
    RETURNING seq
)
SELECT id, attempts, owner_id, target, queue, last_seq, sha256, document FROM claimed
"""
_CLAIM_DELIVERED = _CLAIM.format(which="%(run)s", also="")
# The next run of a slot whose finish is in the same transaction (`run_claim_next`): the first
# candidate still waiting and unpublished that no other transaction holds, and only while the
# worker is online — a drained worker takes no new run, however it would get it.
_CLAIM_NEXT = _CLAIM.format(which=f"""(
        SELECT c.id FROM unnest(%(candidates)s::uuid[]) WITH ORDINALITY AS c(id, n)
        JOIN runs_run x ON x.id = c.id
        WHERE x.status = '{RunStatus.QUEUED}' AND x.queue = %(queue)s
          AND (x.dispatched_at IS NULL OR x.dispatched_at < %(fresh)s)
        ORDER BY c.n LIMIT 1 FOR UPDATE OF x SKIP LOCKED)""", also=f"""
      AND EXISTS (SELECT 1 FROM fleet_worker w WHERE w.name = %(name)s
                  AND w.state = '{WorkerState.ONLINE}')""")


def run_claim(*, run_id: str, worker: str) -> Claim | None:
    """Take a queued run for `worker` (compare-and-set); None if someone else has it or it ended.

    A duplicate delivery of a run id lands here and gets None: it never executes twice. One
    statement (one round trip, atomic on its own) moves the run, takes the lease, logs the
    `status` event with its seq and returns the graph; the event is published after it.
    """
    if not is_uuid(run_id):
        return None
    # no transaction block: BEGIN and COMMIT were 2 of 4 round trips
    return _claim(_CLAIM_DELIVERED, {"worker": worker, "run": run_id})


def run_claim_next(
    *, candidates: Sequence[str], queue: str, fresh: Any, worker: str, name: str
) -> Claim | None:
    """`run_claim` of the first of `candidates` (in the dispatcher's order) still queued in
    `queue` and not published since `fresh`, for a slot of `worker` (lease key) whose run's
    finish is in the caller's transaction (`queue_take_next`, below). A candidate
    another transaction is marking or claiming is skipped, not waited for. None, and nothing
    written, when none is left or worker `name` is not online."""
    return _claim(_CLAIM_NEXT, {"worker": worker, "candidates": list(candidates),
                                "queue": queue, "fresh": fresh, "name": name})


def _claim(statement: str, params: dict[str, Any]) -> Claim | None:
    edge_check([RunStatus.QUEUED], RunStatus.RUNNING)
    with connection.cursor() as cursor:
        cursor.execute(statement, {**params, "lease": settings.INLINE_LEASE_SECONDS})
        row = cursor.fetchone()
    if row is None:
        return None
    worker = params["worker"]
    run_uuid, attempt, owner_id, target, queue, seq, sha, document = row
    run_id = str(run_uuid)
    status = {"status": RunStatus.RUNNING, "attempt": attempt, "worker": worker}
    group_send_after_commit(run_group(run_id), {"type": "run.event", "event": {
        **status, "type": "status", "runId": run_id, "seq": seq}})
    if isinstance(document, str | bytes):
        document = json.loads(document)
    return Claim(run_id, attempt, owner_id, target, sha, document, queue)


def run_events_flush(
    *, claim: Claim, events: Sequence[tuple[str, dict[str, Any]]], takes: Sequence[TakeDraft] = ()
) -> dict[tuple[str, int], dict[str, Any]] | None:
    """Write our attempt's buffered events and takes in one transaction; None (nothing written)
    once the attempt no longer owns the run. Returns the kept takes' wire shapes by slot
    (node id, index) — a slot a lost earlier attempt already filled answers that take.

    Events without takes (progress): one statement, no transaction block
    (`run_events_append_fenced`)."""
    if events and not takes:
        written = run_events_append_fenced(run_id=claim.run_id, attempt=claim.attempt,
                                           events=[(t, _bind_takes(p, {})) for t, p in events])
        return None if written is None else {}
    with transaction.atomic():
        # Reserve the seqs first: the fence answers before any take's bytes are written.
        first_seq = run_seqs_reserve(run_id=claim.run_id, attempt=claim.attempt, count=len(events))
        if first_seq is None:
            return None
        kept = _takes_write(claim, takes)
        events_insert(run_id=claim.run_id, first_seq=first_seq,
                      events=[(t, _bind_takes(p, kept)) for t, p in events])
    return kept


_FINISH = f"""
UPDATE runs_run
SET status = %(status)s, finished_at = now(), lease_expires_at = NULL,
    error_code = %(code)s, error_message = %(message)s, error_node = %(node)s,
    last_seq = last_seq + %(events)s, peak_memory_bytes = %(peak)s,
    shown_values = %(values)s::jsonb
WHERE id = %(run)s AND attempts = %(attempt)s AND status = '{RunStatus.RUNNING}'
RETURNING last_seq, queue, EXISTS (SELECT 1 FROM takes_take t WHERE t.run_id = runs_run.id),
    EXISTS (SELECT 1 FROM runs_run w WHERE w.status = '{RunStatus.QUEUED}' AND w.queue = runs_run.queue)
"""

# Called inside a finish's transaction, after its writes, with the run's queue, when runs of
# that queue wait: may claim one of them for the finishing slot; returns whether it did.
NextRun = Callable[[str], bool]


def run_finish(
    *, claim: Claim, status: str, error: dict[str, str] | None = None,
    events: Sequence[tuple[str, dict[str, Any]]] = (), takes: Sequence[TakeDraft] = (),
    next_run: NextRun | None = None, peak_memory_bytes: int | None = None,
    values: Sequence[dict[str, Any]] = (),
) -> bool:
    """Record the outcome of our attempt with its last events and takes, all in one transaction
    (fenced by `attempt`); False, and nothing written, if we no longer own the run.
    `peak_memory_bytes`: the worker's peak memory while the attempt ran (workers/memory.py).
    `values`: what the attempt's value previews showed (all of them: an attempt recomputes
    every one, so the run keeps exactly the last attempt's).

    After commit the run's queue is dispatched into the freed slot — unless `next_run` (the
    worker's slot, workers/attempt.py) took a waiting run of the queue inside this transaction:
    then the slot never counts as free (one run ends and the next starts in one commit), the
    queue's busy count is unchanged and there is nothing to dispatch."""
    edge_check([RunStatus.RUNNING], status)
    error = error or {}
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(_FINISH, {
                "status": status, "code": error.get("code", ""),
                "message": error.get("message", ""), "node": error.get("nodeId") or "",
                "events": len(events) + 1, "run": claim.run_id, "attempt": claim.attempt,
                "peak": peak_memory_bytes, "values": json.dumps(list(values)),
            })
            row = cursor.fetchone()
        if row is None:
            return False
        last_seq, queue, had_takes, waiting = row
        if had_takes:  # earlier flushes or attempts kept takes: the log's run_done lists all
            if takes:
                takes_insert(run_id=claim.run_id, owner_id=claim.owner_id, drafts=takes)
            rows = _run_takes(claim.run_id)
        else:  # the common case, a quick graph's takes all written here: nothing to read back
            rows = takes_insert(run_id=claim.run_id, owner_id=claim.owner_id, drafts=takes,
                                fresh=True) if takes else []
            rows.sort(key=lambda t: (t.created_at, t.node_id, t.index))  # as Take's ordering
        every = [take_to_wire(t) for t in rows]
        kept = {(t["nodeId"], t["index"]): t for t in every}
        done = {"status": status, "error": run_error_of(error), "takes": every,
                "values": list(values)}
        bound = [(t, _bind_takes(p, kept)) for t, p in events] + [("run_done", done)]
        events_insert(run_id=claim.run_id, first_seq=last_seq - len(bound) + 1, events=bound)
        _after_finish(queue, waiting, next_run)
    return True


def _after_finish(queue: str, waiting: bool, next_run: NextRun | None) -> None:
    """The end of a finish's transaction: the slot's next run, or the queue's dispatch after
    commit."""
    if waiting and next_run is not None and next_run(queue):
        return
    dispatch_after_commit(queue)


def run_error_of(error: dict[str, str]) -> dict[str, Any] | None:
    """The wire shape of an outcome's error (as `run_error` shapes a stored run's)."""
    if not error.get("code"):
        return None
    return {"code": error["code"], "message": error.get("message", ""),
            "nodeId": error.get("nodeId") or None}


def _takes_write(claim: Claim, takes: Sequence[TakeDraft]) -> dict[tuple[str, int], dict[str, Any]]:
    if not takes:
        return {}
    return {slot: take_to_wire(t) for slot, t in takes_keep(
        run_id=claim.run_id, owner_id=claim.owner_id, drafts=takes).items()}


def _run_takes(run_id: str) -> list[Any]:
    return list(Take.objects.filter(run_id=run_id).order_by("created_at", "node_id", "index"))


def _bind_takes(payload: dict[str, Any], kept: dict[tuple[str, int], dict[str, Any]]) -> dict[str, Any]:
    """A buffered `node_done` names its takes by slot (`takeSlots`); put their wire shapes in."""
    slots = payload.get("takeSlots")
    if slots is None:
        return payload
    body = {k: v for k, v in payload.items() if k != "takeSlots"}
    body["takes"] = [kept[(node, index)] for node, index in slots if (node, index) in kept]
    return body


def run_is_current(*, run_id: str, attempt: int) -> bool:
    """Whether our attempt still owns the run (not cancelled, not reaped and retried)."""
    return Run.objects.filter(pk=run_id, status=RunStatus.RUNNING, attempts=attempt).exists()


def run_hand_back(*, run_id: str, attempt: int, reason: str, fault: bool = False) -> bool:
    """Put our running attempt back in the queue at once (worker stopping, or an infrastructure
    `fault` during the attempt); the next attempt starts from the top. Fenced by `attempt`.

    A fault on the last allowed attempt (INLINE_MAX_ATTEMPTS) fails the run with the reason
    instead: an error that repeats on every attempt (a statement timeout, a full disk) must not
    requeue it forever. A stopping worker's hand-back is the operator's doing, never capped.
    """
    if fault and attempt >= settings.INLINE_MAX_ATTEMPTS:
        error = {"code": "worker_fault", "message": f"{reason}; gave up after {attempt} attempts"}
        claim = Claim(run_id, attempt, 0, "", "", {})
        return run_finish(claim=claim, status=RunStatus.FAILED, error=error)
    with transaction.atomic():
        moved = run_move(
            Run.objects.filter(pk=run_id, attempts=attempt), source=[RunStatus.RUNNING],
            to=RunStatus.QUEUED, lease_expires_at=None, dispatched_at=None,
        )
        if moved:
            run_event_append(run_id=run_id, type="status",
                             payload={"status": RunStatus.QUEUED, "reason": reason})
            queue = Run.objects.values_list("queue", flat=True).get(pk=run_id)
            dispatch_after_commit(queue)
    return bool(moved)


def run_leases_renew(*, worker: str, held: Sequence[tuple[str, int]]) -> set[str]:
    """Extend the leases of the attempts `worker` holds; returns the run ids still ours (a run
    missing from the answer was cancelled, reaped or finished: its executor must stop)."""
    if not held:
        return set()
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE runs_run SET lease_expires_at = now() + make_interval(secs => %s) "
            f"WHERE status = '{RunStatus.RUNNING}' AND lease_worker = %s AND (id, attempts) IN "
            "(SELECT * FROM unnest(%s::uuid[], %s::int[])) RETURNING id",
            [settings.INLINE_LEASE_SECONDS, worker, [r for r, _ in held], [a for _, a in held]],
        )
        return {str(row[0]) for row in cursor.fetchall()}


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
    free slot is this one. The choice is the policy's (`queue_next_picks`), read after the
    finish's writes, as if the slot were free already. Should more slots be free than this one,
    the queue is dispatched after commit too."""
    picks = queue_next_picks(queue, NEXT_CANDIDATES)
    if picks is None:
        return None
    # a few in the policy's order: one another slot or pass is taking meanwhile is skipped
    claim = run_claim_next(candidates=picks.candidates, queue=queue, fresh=picks.fresh,
                           worker=worker, name=name)
    if claim is not None and picks.others_free:
        dispatch_after_commit(queue)  # the other free slots
    return claim
