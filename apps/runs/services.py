"""Writes on runs: submit (validate, idempotency, coalescing), cancel, claim, finish, hand back.

Every status change is a compare-and-set along an edge declared in RUN_TRANSITIONS: through
`run_move` (apps/runs/transitions.py), or, on the worker's hot path, a single hand-written
UPDATE … RETURNING that checks the same table with `edge_check` first.

The hot path costs one transaction per step a client can observe: submit (one), claim (one),
progress flushes (one per flush), finish (one, with the takes and the last events).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from apps.fleet.routing import RunCannotFit, need_estimate, parallel_request
from apps.fleet.selectors import LiveFleet
from apps.graphs.families import activation_for, fleet_files, graph_families_check
from apps.graphs.models import Graph
from apps.graphs.schema import GraphDoc
from apps.graphs.validation import GraphInvalid, closure_order, graph_validate, param_refs
from apps.runs.events import (
    events_doc,
    events_insert,
    events_publish,
    run_event_append,
    run_events_append_fenced,
    run_group,
    run_seqs_reserve,
)
from apps.runs.models import IN_FLIGHT, ClientRunKey, Run, RunStatus
from apps.runs.transitions import edge_check, run_move
from apps.runs.wire import run_done_payload
from apps.takes.models import Take
from apps.takes.selectors import ASSETS_VISIBLE, assets_visible_to_owner
from apps.takes.services import TakeDraft, takes_insert, takes_keep
from apps.takes.storage import (
    BLOB_LOCK_SPACE,
    blob_lock_key,
    blob_place,
    blob_stage_soon,
    blob_unstage,
)
from apps.takes.wire import take_to_wire
from inline_farm.effects import group_send_after_commit
from inline_farm.ids import is_uuid
from inline_farm.prepared import prepared_cursor

if TYPE_CHECKING:
    from apps.runs.dispatch import LoneDispatch

log = logging.getLogger(__name__)

# Advisory-lock namespaces (pg_advisory_xact_lock(namespace, key)).
LOCK_OWNER_SUBMIT = 1
LOCK_QUEUE_DISPATCH = 2
LOCK_TEAM_SUBMIT = 3


class RunConflict(Exception):
    """A clientRunId was reused with a different graph or target."""


class RunLimitReached(Exception):
    """The owner has too many runs in flight."""


class RunPriorityNotAllowed(Exception):
    """The owner asked for a priority above the one staff allow them."""


class RunNotCancellable(Exception):
    """The run already finished (succeeded or failed)."""


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


# --- submit -----------------------------------------------------------------------------------

def run_submit(
    *,
    owner: User,
    graph: GraphDoc,
    target: str,
    client_run_id: str | None = None,
    priority: int = 0,
) -> tuple[Run, bool]:
    """Validate and queue a run; returns (run, created).

    The same clientRunId with the same graph+target returns its run (also once it finished, and
    also when that submit was coalesced onto another run); with another graph it raises
    RunConflict. An identical graph+target already in flight for the owner is returned instead
    of a new run (coalescing). Nothing is stored when validation fails.
    """
    normalised = graph_validate(graph, target=target, max_nodes=settings.INLINE_MAX_GRAPH_NODES)
    order = closure_order(normalised, target)
    assets = list(param_refs(normalised, order, "asset"))
    plain = client_run_id is None and not _team_limits(owner)
    if not plain:
        _assets_check(owner, assets)  # the plain path checks them in its statement
    requirement, queue = _requirement(normalised, order)
    _priority_check(owner, priority)
    sha = normalised.sha256()
    if plain:
        return _run_create_plain(owner, normalised, sha, target, priority, requirement, queue,
                                 assets)
    try:
        return _run_create_or_find(owner, normalised, sha, target, client_run_id, priority,
                                   requirement, queue)
    except IntegrityError:
        # Another owner's submit of the same new graph document won the insert: look again.
        return _run_create_or_find(owner, normalised, sha, target, client_run_id, priority,
                                   requirement, queue)


@transaction.atomic
def _run_create_or_find(
    owner: User, graph: GraphDoc, sha: str, target: str,
    client_run_id: str | None, priority: int, requirement: dict[str, Any], queue: str,
) -> tuple[Run, bool]:
    # One owner's submits take turns (a transaction-scoped advisory lock): the in-flight limit,
    # coalescing and clientRunId checks below then see every earlier submit of that owner.
    advisory_lock(LOCK_OWNER_SUBMIT, owner.pk)
    existing, in_flight = _existing_run(owner, sha, target, client_run_id)
    if existing is not None:
        return existing, False
    _limit_check(owner, in_flight)
    run = Run.objects.create(
        owner=owner, graph_id=_graph_id(sha, graph), target=target,
        client_run_id=client_run_id or None, priority=priority, requirement=requirement,
        queue=queue,
    )
    if client_run_id:
        ClientRunKey.objects.create(owner=owner, key=client_run_id, run=run, graph_sha256=sha,
                                    target=target)
    dispatch_after_commit(run.queue)
    return run, True


def dispatch_after_commit(queue: str) -> None:
    """Dispatch `queue` once the current transaction commits (a submit, finish, cancel or
    requeue: apps/runs/dispatch.py takes the queue's lock only in a statement of its own, never
    in such a transaction). Robust: what was committed stands, so a pass that fails (the
    database gone a moment) is logged, not raised into the caller — a submit still answers 201
    — and beat's pass publishes what waits within INLINE_REDISPATCH_SECONDS, as it does for a
    process that died in between."""
    transaction.on_commit(lambda: dispatch_queue_soon(queue), robust=True)


# A submit without clientRunId by an owner without team limits (the common case), after the
# owner's lock: which of its assets the owner may use, the coalescing and in-flight checks, the
# graph upsert and the run's insert (both only when every check passes), in one statement
# where they were five (bench/hotpath.py's web-side timeline). The asset check is
# `assets_visible_to_owner`'s statement. The INSERT's columns and casts come from the Run model
# (`_submit_plain`), so a migration that adds a column changes the text.
_SUBMIT_PLAIN = """
WITH visible AS ({assets_visible}), flight AS (
    SELECT (SELECT r.id FROM runs_run r JOIN graphs_graph g ON g.id = r.graph_id
            WHERE r.owner_id = %(owner)s AND g.sha256 = %(sha)s AND r.target = %(target)s
              AND r.status IN ('queued', 'running') LIMIT 1) AS same,
           (SELECT count(*) FROM runs_run WHERE owner_id = %(owner)s
              AND status IN ('queued', 'running')) AS busy
), go AS (
    SELECT 1 FROM flight WHERE same IS NULL AND busy < %(limit)s AND %(found)s = (
        SELECT count(*) FROM visible)
), stored AS (
    INSERT INTO graphs_graph (sha256, document, created_at)
    SELECT %(sha)s, %(doc)s::jsonb, now() FROM go
    ON CONFLICT (sha256) DO NOTHING RETURNING id
), graph AS (
    SELECT id FROM stored
    UNION ALL SELECT id FROM graphs_graph WHERE sha256 = %(sha)s AND EXISTS (SELECT 1 FROM go)
    LIMIT 1
), made AS (
    {insert} RETURNING graph_id
)
SELECT flight.same, flight.busy, (SELECT graph_id FROM made), ARRAY(SELECT id FROM visible)
FROM flight
"""


@functools.cache
def _submit_plain() -> tuple[str, list[Any]]:
    """(`_SUBMIT_PLAIN` with the run's INSERT filled in from the Run model, the fields whose
    values that INSERT takes as parameters `f_<column>`); the graph's id comes from the
    statement."""
    fields = list(Run._meta.concrete_fields)
    columns = ", ".join(f.column for f in fields)
    values = ", ".join("graph.id" if f.column == "graph_id"
                       else f"%(f_{f.column})s::{f.db_type(connection)}" for f in fields)
    insert = f"INSERT INTO runs_run ({columns}) SELECT {values} FROM graph"
    statement = _SUBMIT_PLAIN.format(insert=insert, assets_visible=ASSETS_VISIBLE)
    return statement, [f for f in fields if f.column != "graph_id"]


def _run_create_plain(
    owner: User, graph: GraphDoc, sha: str, target: str, priority: int,
    requirement: dict[str, Any], queue: str, assets: list[AssetRef],
) -> tuple[Run, bool]:
    """`_run_create_or_find` (and `_assets_check`) without clientRunId or team limits, with its
    dispatch, in one round trip.

    Outside any transaction (the API's submit): the owner's lock, `_SUBMIT_PLAIN` and the run's
    dispatch (`lone_dispatch`: the mark, when the run is the only one its queue could pick),
    pipelined in autocommit mode, are one implicit transaction that the pipeline's Sync commits
    on the server — no BEGIN, no COMMIT, no round trip of the dispatch's own. Each statement of
    it takes its own snapshot, so the statement, run after the lock is granted, sees every
    earlier submit of the owner (as in a transaction block). When its checks refuse, it wrote
    nothing (and the dispatch found no run to mark). A dispatch that fails is undone on its own,
    robust as `dispatch_after_commit`. Inside a caller's transaction (tests, a caller that
    writes more) the two statements join it and the dispatch waits for its commit."""
    limits = _limits_of(owner)
    limit = limits.max_inflight_runs if limits else settings.INLINE_MAX_INFLIGHT_RUNS_PER_USER
    run = Run(owner=owner, target=target, priority=priority, requirement=requirement,
              queue=queue, created_at=timezone.now())
    statement, fields = _submit_plain()
    params = {f"f_{f.column}": f.get_db_prep_save(getattr(run, f.attname), connection)
              for f in fields}
    wanted = sorted(set(_asset_ids(assets)))
    # `found` counts every distinct reference, malformed ones too (never visible): the statement
    # then inserts only when all of them are the owner's — it commits, nothing rolls it back
    named = {str(value) for _, _, value in assets}
    params.update(owner=owner.pk, sha=sha, target=target, limit=limit,
                  doc=json.dumps(graph.model_dump()), ids=wanted, found=len(named),
                  all=owner.is_staff, me=owner.pk)
    own = not connection.in_atomic_block
    from apps.runs.dispatch import lone_dispatch

    lone = lone_dispatch(run.queue, str(run.pk)) if own else None
    dispatched: tuple[Any, ...] | None = None
    for attempt in range(2):
        if own:
            (same, busy, graph_id, visible), dispatched = _submit_committed(
                statement, params, owner.pk, lone)
        else:
            with transaction.atomic():
                same, busy, graph_id, visible = _submit_joined(statement, params, owner.pk,
                                                               lock=attempt == 0)
        _assets_found(assets, {str(v) for v in visible})
        if same is not None:
            return Run.objects.get(pk=same), False  # coalesced onto the run in flight
        if busy >= limit:
            raise RunLimitReached(f"you have {limit} runs in flight; wait for some to finish")
        if graph_id is not None:
            break
        # Another submit committed the same new graph after this statement's snapshot was taken:
        # its insert waited and did nothing, and the snapshot cannot see the row. Look again.
    else:
        raise IntegrityError(f"graph {sha} was neither inserted nor found")
    run.graph_id = graph_id
    run._state.adding, run._state.db = False, connection.alias  # as the ORM leaves a saved row
    if own:
        _dispatch_submitted(lone, dispatched)
    else:
        dispatch_after_commit(run.queue)
    return run, True


def _submit_committed(
    statement: str, params: dict[str, Any], owner: int, lone: LoneDispatch | None
) -> tuple[tuple[Any, ...], tuple[Any, ...] | None]:
    """The owner's lock, `statement` and the dispatch `lone` as one implicit transaction
    (autocommit + pipeline): sent together with the Sync that commits them; the answers (the
    statement's row, the dispatch's) read after it."""
    with prepared_cursor() as cursor, prepared_cursor() as dispatch:
        # Django's errors, as for any statement: the pipeline's Sync may raise the statement's
        with connection.wrap_database_errors, connection.connection.pipeline():
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [LOCK_OWNER_SUBMIT, owner])
            cursor.execute(statement, params)
            if lone is not None:
                dispatch.execute(lone.statement, lone.params)
        return tuple(cursor.fetchone()), None if lone is None else tuple(dispatch.fetchone())


def _submit_joined(statement: str, params: dict[str, Any], owner: int, *,
                   lock: bool) -> tuple[Any, ...]:
    """The owner's lock (`lock`: not again on a retry, it is held) and `statement` in the
    current transaction: BEGIN and both in one pipelined round trip."""
    with prepared_cursor() as cursor, _pipelined(first=lock):
        if lock:
            # Its own statement, ahead of `_SUBMIT_PLAIN`, whose snapshot (taken when it starts,
            # after the lock is granted) then sees every earlier submit of the owner.
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [LOCK_OWNER_SUBMIT, owner])
        cursor.execute(statement, params)
        return tuple(cursor.fetchone())


def _dispatch_submitted(lone: LoneDispatch | None, answer: tuple[Any, ...] | None) -> None:
    """After a committed submit: act on its dispatch's answer (publish its run, or the full
    pass), robust as `dispatch_after_commit`: a dispatch that failed (the database gone a moment,
    its function refusing) is logged and the submit still answers; beat's pass publishes."""
    if lone is None or answer is None:
        return  # nobody serves the queue (yet): nothing to publish
    try:
        lone.answered(*answer)
    except Exception:
        log.exception("dispatching queue %s after the submit of run %s failed; beat's pass "
                      "will publish it", lone.queue, lone.run_id)


@contextmanager
def _pipelined(*, first: bool) -> Iterator[None]:
    """psycopg's pipeline mode on this connection while the block runs (`first`): statements are
    sent without waiting for each answer; a fetch waits for all of them, in order."""
    if not first:
        yield
        return
    with connection.connection.pipeline():
        yield


def advisory_lock(namespace: int, key: int) -> None:
    """Take a transaction-scoped advisory lock (call inside `transaction.atomic()`)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [namespace, key])


_IN_FLIGHT = """
SELECT (SELECT r.id FROM runs_run r JOIN graphs_graph g ON g.id = r.graph_id
        WHERE r.owner_id = %(owner)s AND g.sha256 = %(sha)s AND r.target = %(target)s
          AND r.status IN ('queued', 'running') LIMIT 1),
       (SELECT count(*) FROM runs_run WHERE owner_id = %(owner)s
          AND status IN ('queued', 'running'))
"""


def _existing_run(
    owner: User, sha: str, target: str, client_run_id: str | None
) -> tuple[Run | None, int]:
    """(the run this submit already has, the owner's runs in flight): the run of its
    clientRunId, else the same graph+target in flight (coalesced; the clientRunId is then
    recorded for that run). Hold the owner's lock."""
    if client_run_id:
        key = ClientRunKey.objects.select_related("run").filter(
            owner=owner, key=client_run_id
        ).first()
        if key is not None:
            if key.graph_sha256 != sha or key.target != target:
                raise RunConflict(
                    f"clientRunId {client_run_id!r} was already used for a different graph or target"
                )
            return key.run, 0
    with prepared_cursor() as cursor:
        cursor.execute(_IN_FLIGHT, {"owner": owner.pk, "sha": sha, "target": target})
        run_id, in_flight = cursor.fetchone()
    if run_id is None:
        return None, int(in_flight)
    run = Run.objects.get(pk=run_id)
    if client_run_id:
        ClientRunKey.objects.create(owner=owner, key=client_run_id, run=run, graph_sha256=sha,
                                    target=target)
    return run, int(in_flight)


_GRAPH_UPSERT = """
WITH kept AS (
    INSERT INTO graphs_graph (sha256, document, created_at) VALUES (%(sha)s, %(doc)s::jsonb, now())
    ON CONFLICT (sha256) DO NOTHING RETURNING id)
SELECT id FROM kept UNION ALL SELECT id FROM graphs_graph WHERE sha256 = %(sha)s LIMIT 1
"""


def _graph_id(sha: str, graph: GraphDoc) -> int:
    """The stored graph of content hash `sha`, inserted on first use (one round trip)."""
    with prepared_cursor() as cursor:
        cursor.execute(_GRAPH_UPSERT, {"sha": sha, "doc": json.dumps(graph.model_dump())})
        row = cursor.fetchone()
    if row is None:  # another transaction committed it after this statement's snapshot
        return int(Graph.objects.values_list("pk", flat=True).get(sha256=sha))
    return int(row[0])


def _limits_of(owner: User) -> Any:
    return getattr(owner, "limits", None)  # a UserLimits row, or None for the defaults


def _limit_check(owner: User, in_flight: int) -> None:
    """The owner's in-flight limit, then each of their teams' (under the team's lock)."""
    limits = _limits_of(owner)
    limit = limits.max_inflight_runs if limits else settings.INLINE_MAX_INFLIGHT_RUNS_PER_USER
    if in_flight >= limit:
        raise RunLimitReached(f"you have {limit} runs in flight; wait for some to finish")
    for team_id, name, team_limit in _team_limits(owner):
        advisory_lock(LOCK_TEAM_SUBMIT, team_id)
        busy = Run.objects.filter(owner__teams=team_id, status__in=IN_FLIGHT).count()
        if busy >= team_limit:
            raise RunLimitReached(
                f"team {name!r} has {team_limit} runs in flight; wait for some to finish"
            )


def _team_limits(owner: User) -> list[tuple[int, str, int]]:
    """(id, name, limit) of the owner's teams that have an in-flight limit. Remembered on the
    user object, which the token lookup itself remembers for a few seconds."""
    cached = getattr(owner, "_farm_team_limits", None)
    if cached is None:
        from apps.accounts.models import Team

        cached = list(Team.objects.filter(members=owner, max_inflight_runs__isnull=False)
                      .values_list("pk", "name", "max_inflight_runs"))
        owner._farm_team_limits = cached  # type: ignore[attr-defined]
    return cached


def _priority_check(owner: User, priority: int) -> None:
    """Priority sorts before fair share, so raising it is a privilege staff grant per user."""
    if priority <= 0 or owner.is_staff:
        return
    limits = _limits_of(owner)
    allowed = limits.max_priority if limits else 0
    if priority > allowed:
        raise RunPriorityNotAllowed(
            f"priority {priority} is above the {allowed} you may use; ask staff to raise your "
            "limit (user limits → max priority)"
        )


AssetRef = tuple[str, Any, Any]  # (node id, param, value): `param_refs(…, "asset")`


def _assets_check(owner: User, refs: list[AssetRef]) -> None:
    wanted = _asset_ids(refs)
    visible = (assets_visible_to_owner(owner_id=owner.pk, asset_ids=wanted, owner=owner)
               if wanted else set())
    _assets_found(refs, visible)


def _asset_ids(refs: list[AssetRef]) -> list[str]:
    return [str(value) for _, _, value in refs if is_uuid(value)]


def _assets_found(refs: list[AssetRef], visible: set[str]) -> None:
    """GraphInvalid naming the first node whose asset the owner may not use (or that is gone)."""
    for node_id, param, value in refs:
        if str(value) not in visible:
            raise GraphInvalid(
                "asset_not_found", f"param {param.name!r}: no asset {value!r} (upload it first)",
                node_id,
            )


def _requirement(graph: GraphDoc, order: list[str]) -> tuple[dict[str, Any], str]:
    """What a worker must offer — the node types, the model files the closure names, and the
    memory it needs (apps/fleet/routing.py) — and the queue that routes it to. Checked against
    the live fleet, read once: a file no live worker holds, or a run no live worker holding its
    files could fit, is a 422. A graph without model files goes to `cpu` without a read."""
    refs = list(param_refs(graph, order, "model"))
    types = sorted({graph.nodes[n].type for n in order})
    if not refs:
        return {"nodeTypes": types, "models": []}, "cpu"
    fleet = LiveFleet()
    catalog, sizes = fleet.catalog(), fleet.sizes()
    models = []
    for node_id, param, value in refs:
        folder = param.options_from or ""
        if value not in catalog.get(folder, []):
            raise GraphInvalid(
                "model_not_found",
                f"param {param.name!r}: no live worker holds {folder}/{value}; put the file in "
                f"the models dir under {folder}/ on a worker",
                node_id,
            )
        models.append({"folder": folder, "name": value})
    unique = {(m["folder"], m["name"]) for m in models}
    families = graph_families_check(graph, order, fleet_files(fleet.workers))  # 422: mixed
    need = need_estimate(model_sizes=[sizes.get(m, 0) for m in sorted(unique)],
                         pixels=_largest_image(graph, order), activation=activation_for(families))
    requirement = {"nodeTypes": types, "models": models, "need": need.to_wire(),
                   "families": sorted(families),
                   "parallel": parallel_request(graph.nodes[n].params.get("parallel")
                                                for n in order)}
    try:
        return requirement, fleet.queue_for(requirement)
    except RunCannotFit as exc:
        raise GraphInvalid("run_cannot_fit", str(exc), refs[0][0]) from None


def _largest_image(graph: GraphDoc, order: list[str]) -> int:
    """The most pixels any node of the closure asks for (its width × height params)."""
    largest = 0
    for node_id in order:
        params = graph.nodes[node_id].params
        width, height = params.get("width"), params.get("height")
        if isinstance(width, int) and isinstance(height, int):
            largest = max(largest, width * height)
    return largest


# --- cancel -----------------------------------------------------------------------------------

def run_cancel(*, run: Run) -> Run:
    """Cancel a queued or running run; a running worker notices at its next check and stops."""
    with transaction.atomic():
        cancelled = run_move(
            Run.objects.filter(pk=run.pk), source=IN_FLIGHT, to=RunStatus.CANCELLED,
            finished_at=timezone.now(), lease_expires_at=None,
        )
        if cancelled:
            run_event_append(run_id=run.pk, type="run_done", payload=run_done_payload(run.pk))
            run_stop_notify(run_id=run.pk)
            dispatch_after_commit(run.queue)
    run.refresh_from_db()
    if not cancelled and run.status != RunStatus.CANCELLED:
        raise RunNotCancellable(f"run {run.pk} already {run.status}")
    return run


def run_stop_notify(*, run_id: Any) -> None:
    """Tell the worker holding `run_id` to stop now (NOTIFY, delivered when the caller's
    transaction commits; workers/heartbeat.py listens). Call inside the transaction that took
    the run away from its attempt."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify('inline_run_stop', %s)", [str(run_id)])


# --- the worker's side ------------------------------------------------------------------------

_CLAIM = """
WITH claimed AS (
    UPDATE runs_run AS r
    SET status = 'running', attempts = r.attempts + 1, lease_worker = %(worker)s,
        lease_expires_at = now() + make_interval(secs => %(lease)s),
        started_at = COALESCE(r.started_at, now()), dispatched_at = NULL,
        last_seq = r.last_seq + 1
    FROM graphs_graph AS g
    WHERE r.id = {which} AND r.status = 'queued' AND g.id = r.graph_id{also}
    RETURNING r.id, r.attempts, r.owner_id, r.target, r.queue, r.last_seq, g.sha256, g.document
), logged AS (
    INSERT INTO runs_runevent (run_id, seq, type, payload, created_at)
    SELECT id, last_seq, 'status', jsonb_build_object(
        'status', 'running', 'attempt', attempts, 'worker', %(worker)s::text), now()
    FROM claimed
    RETURNING seq
)
SELECT id, attempts, owner_id, target, queue, last_seq, sha256, document FROM claimed
"""
_CLAIM_DELIVERED = _CLAIM.format(which="%(run)s", also="")
# The next run of a slot whose finish is in the same transaction (`run_claim_next`): the first
# candidate still waiting and unpublished that no other transaction holds, and only while the
# worker is online — a drained worker takes no new run, however it would get it.
_CLAIM_NEXT = _CLAIM.format(which="""(
        SELECT c.id FROM unnest(%(candidates)s::uuid[]) WITH ORDINALITY AS c(id, n)
        JOIN runs_run x ON x.id = c.id
        WHERE x.status = 'queued' AND x.queue = %(queue)s
          AND (x.dispatched_at IS NULL OR x.dispatched_at < %(fresh)s)
        ORDER BY c.n LIMIT 1 FOR UPDATE OF x SKIP LOCKED)""", also="""
      AND EXISTS (SELECT 1 FROM fleet_worker w WHERE w.name = %(name)s AND w.state = 'online')""")


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
    finish is in the caller's transaction (apps/runs/dispatch.py `queue_take_next`). A candidate
    another transaction is marking or claiming is skipped, not waited for. None, and nothing
    written, when none is left or worker `name` is not online."""
    return _claim(_CLAIM_NEXT, {"worker": worker, "candidates": list(candidates),
                                "queue": queue, "fresh": fresh, "name": name})


def _claim(statement: str, params: dict[str, Any]) -> Claim | None:
    edge_check([RunStatus.QUEUED], RunStatus.RUNNING)
    with prepared_cursor() as cursor:
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


_FINISH = """
UPDATE runs_run
SET status = %(status)s, finished_at = now(), lease_expires_at = NULL,
    error_code = %(code)s, error_message = %(message)s, error_node = %(node)s,
    last_seq = last_seq + %(events)s
WHERE id = %(run)s AND attempts = %(attempt)s AND status = 'running'
RETURNING last_seq, queue, EXISTS (SELECT 1 FROM takes_take t WHERE t.run_id = runs_run.id),
    EXISTS (SELECT 1 FROM runs_run w WHERE w.status = 'queued' AND w.queue = runs_run.queue)
"""

# Called inside a finish's transaction, after its writes, with the run's queue, when runs of
# that queue wait: may claim one of them for the finishing slot; returns whether it did.
NextRun = Callable[[str, "list[tuple[Any, ...]] | None"], bool]


def run_finish(
    *, claim: Claim, status: str, error: dict[str, str] | None = None,
    events: Sequence[tuple[str, dict[str, Any]]] = (), takes: Sequence[TakeDraft] = (),
    next_run: NextRun | None = None,
) -> bool:
    """Record the outcome of our attempt with its last events and takes, all in one transaction
    (fenced by `attempt`); False, and nothing written, if we no longer own the run.

    After commit the run's queue is dispatched into the freed slot — unless `next_run` (the
    worker's slot, workers/attempt.py) took a waiting run of the queue inside this transaction:
    then the slot never counts as free (one run ends and the next starts in one commit), the
    queue's busy count is unchanged and there is nothing to dispatch."""
    edge_check([RunStatus.RUNNING], status)
    error = error or {}
    if _finish_first_takes(claim, status, error, events, takes, next_run):
        return True
    with transaction.atomic():
        with prepared_cursor() as cursor:
            cursor.execute(_FINISH, {
                "status": status, "code": error.get("code", ""),
                "message": error.get("message", ""), "node": error.get("nodeId") or "",
                "events": len(events) + 1, "run": claim.run_id, "attempt": claim.attempt,
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
        done = {"status": status, "error": run_error_of(error), "takes": every}
        bound = [(t, _bind_takes(p, kept)) for t, p in events] + [("run_done", done)]
        events_insert(run_id=claim.run_id, first_seq=last_seq - len(bound) + 1, events=bound)
        _after_finish(queue, waiting, next_run)
    return True


def _after_finish(queue: str, waiting: bool, next_run: NextRun | None,
                  heads: list[tuple[Any, ...]] | None = None) -> None:
    """The end of a finish's transaction: the slot's next run (`heads`: the queue's, when the
    finish's statement read them), or the queue's dispatch after commit."""
    if waiting and next_run is not None and next_run(queue, heads):
        return
    dispatch_after_commit(queue)


# The finish of a run that has no take yet (the common case: a quick graph's takes all come
# with its finish) in one statement: the takes' blob locks, the fenced status change, the takes
# and the last events. With BEGIN and COMMIT that is three round trips where the general path
# below makes six (bench/hotpath.py's worker-side timeline). No row: the attempt lost the run,
# or the run has takes already (an earlier flush or attempt) — the general path answers both.
_FINISH_FIRST_TAKES = """
WITH held AS (
    SELECT count(pg_advisory_xact_lock_shared(%(space)s, k)) AS n FROM unnest(%(keys)s::int[]) k
), done AS (
    UPDATE runs_run
    SET status = %(status)s, finished_at = now(), lease_expires_at = NULL,
        error_code = %(code)s, error_message = %(message)s, error_node = %(node)s,
        last_seq = last_seq + jsonb_array_length(%(events)s::jsonb)
    WHERE id = %(run)s::uuid AND attempts = %(attempt)s AND status = 'running'
      AND NOT EXISTS (SELECT 1 FROM takes_take t WHERE t.run_id = %(run)s::uuid)
      AND (SELECT n FROM held) >= 0
    RETURNING last_seq, queue,
        EXISTS (SELECT 1 FROM runs_run w WHERE w.status = 'queued' AND w.queue = runs_run.queue)
            AS waiting
), kept AS (
    INSERT INTO takes_take (id, run_id, owner_id, node_id, index, sha256, media_type, size,
                            width, height, seed, lineage, created_at)
    SELECT t.id, %(run)s::uuid, %(owner)s, t.node_id, t.index, t.sha256, t.media_type, t.size,
           t.width, t.height, t.seed, t.lineage, %(created)s
    FROM done, jsonb_to_recordset(%(takes)s::jsonb)
         AS t(id uuid, node_id text, index int, sha256 text, media_type text, size bigint,
              width int, height int, seed bigint, lineage jsonb)
    ON CONFLICT DO NOTHING
    RETURNING 1
), logged AS (
    INSERT INTO runs_runevent (run_id, seq, type, payload, created_at)
    SELECT %(run)s::uuid, done.last_seq - jsonb_array_length(%(events)s::jsonb) + e.n,
           e.doc->>0, e.doc->1, now()
    FROM done, jsonb_array_elements(%(events)s::jsonb) WITH ORDINALITY AS e(doc, n)
    RETURNING 1
)
SELECT last_seq, queue, waiting, (SELECT count(*) FROM kept), (SELECT count(*) FROM logged),
       CASE WHEN %(heads)s AND waiting THEN {heads_json} END
FROM done
"""


@functools.cache
def _finish_first_takes_sql() -> str:
    """`_FINISH_FIRST_TAKES` with the dispatcher's heads read (`HEADS_JSON`) filled in: read
    (only for a slot that may take the queue's next run, `%(heads)s`, while runs of the queue
    wait) in the statement that finishes the run, counting that run as finished (`leaving`)."""
    from apps.runs.dispatch import HEADS_JSON

    return _FINISH_FIRST_TAKES.format(heads_json=HEADS_JSON)


class _NotFirstTakes(Exception):
    """Roll `_finish_first_takes` back: the general path keeps one take per slot."""


def _finish_first_takes(
    claim: Claim, status: str, error: dict[str, str],
    events: Sequence[tuple[str, dict[str, Any]]], takes: Sequence[TakeDraft],
    next_run: NextRun | None,
) -> bool:
    """`run_finish` for a run with no take yet; False (nothing written) to leave it to the
    general path. The bytes are written to disk meanwhile (staged: nobody's yet) and named
    after the statement, which holds their blob locks until commit (apps/takes/storage.py), and
    only when it wrote the takes: an attempt that lost the run keeps none."""
    now = timezone.now()
    rows = sorted((Take(id=uuid.uuid4(), run_id=claim.run_id, owner_id=claim.owner_id,
                        node_id=d.node_id, index=d.index, sha256=hashlib.sha256(d.data).hexdigest(),
                        media_type=d.media_type, size=len(d.data), width=d.width,
                        height=d.height, seed=d.seed, lineage=d.lineage, created_at=now)
                   for d in takes), key=lambda t: (t.node_id, t.index))  # as Take's ordering
    drafts = sorted(takes, key=lambda d: (d.node_id, d.index))  # as `rows`
    # The takes' bytes go to disk (temp files that are nobody's until `blob_place` names them
    # under the statement's blob locks) while this thread prepares and sends BEGIN and the
    # statement: their fsync was the finish's longest wait (bench/timeline.py).
    staging = blob_stage_soon([(d.data, t.sha256) for t, d in zip(rows, drafts, strict=True)]
                              ) if rows else None
    placed = False
    try:
        every = [take_to_wire(t) for t in rows]
        kept = {(t["nodeId"], t["index"]): t for t in every}
        done = {"status": status, "error": run_error_of(error), "takes": every}
        bound = [(t, _bind_takes(p, kept)) for t, p in events] + [("run_done", done)]
        from apps.runs.dispatch import heads_for_finish, heads_from_json

        heads = heads_for_finish(claim.queue, claim.run_id, wanted=next_run is not None)
        params = {
            **heads, "space": BLOB_LOCK_SPACE, "keys": sorted({blob_lock_key(t.sha256) for t in rows}),
            "status": status, "code": error.get("code", ""), "message": error.get("message", ""),
            "node": error.get("nodeId") or "", "run": claim.run_id, "attempt": claim.attempt,
            "owner": claim.owner_id, "created": now, "events": events_doc(bound),
            "takes": json.dumps([{
                "id": str(t.id), "node_id": t.node_id, "index": t.index, "sha256": t.sha256,
                "media_type": t.media_type, "size": t.size, "width": t.width, "height": t.height,
                "seed": t.seed, "lineage": t.lineage} for t in rows])}
        with transaction.atomic():
            with prepared_cursor() as cursor:
                cursor.execute(_finish_first_takes_sql(), params)
                row = cursor.fetchone()
            if row is None:
                return False  # the general path answers
            last_seq, queue, waiting, inserted, logged, heads_read = row
            if (inserted, logged) != (len(rows), len(bound)):  # two drafts of one slot
                raise _NotFirstTakes
            staged = staging.result() if staging is not None else []
            for take, draft, tmp in zip(rows, drafts, staged, strict=True):
                blob_place(tmp, draft.data, take.sha256)  # under the statement's blob locks
            placed = True
            first = last_seq - len(bound) + 1
            events_publish(claim.run_id, [{**p, "type": t, "runId": claim.run_id, "seq": first + i}
                                          for i, (t, p) in enumerate(bound)])
            _after_finish(queue, waiting, next_run,
                          None if heads_read is None else heads_from_json(heads_read))
    except _NotFirstTakes:
        return False
    finally:
        if staging is not None and not placed:  # the run was lost, or the finish failed
            blob_unstage(staging)
    return True


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
            "WHERE status = 'running' AND lease_worker = %s AND (id, attempts) IN "
            "(SELECT * FROM unnest(%s::uuid[], %s::int[])) RETURNING id",
            [settings.INLINE_LEASE_SECONDS, worker, [r for r, _ in held], [a for _, a in held]],
        )
        return {str(row[0]) for row in cursor.fetchall()}


def dispatch_queue_soon(queue: str) -> None:
    """Publish the next runs of `queue` now (after commit of a new, finished or requeued run)."""
    from apps.runs.dispatch import queue_dispatch

    queue_dispatch(queue)

