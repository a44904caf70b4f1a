"""Writes on runs: submit (validate, idempotency, coalescing), cancel, claim, lease, finish.

Every status change goes through `run_move` (apps/runs/transitions.py): a compare-and-set along
an edge declared in RUN_TRANSITIONS, where the count says who won.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import F
from django.db.models.functions import Coalesce
from django.utils import timezone

from apps.fleet.selectors import model_catalog, queue_for
from apps.graphs.models import Graph
from apps.graphs.schema import GraphDoc
from apps.graphs.validation import GraphInvalid, closure_order, graph_validate, param_refs
from apps.runs.events import run_event_append
from apps.runs.models import IN_FLIGHT, Run, RunStatus
from apps.runs.transitions import run_move
from apps.runs.wire import run_done_payload
from apps.takes.selectors import assets_visible_to_owner
from inline_farm.ids import is_uuid


class RunConflict(Exception):
    """A clientRunId was reused with a different graph or target."""


class RunLimitReached(Exception):
    """The owner has too many runs in flight."""


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

    The same clientRunId with the same graph+target returns its run; with another graph it raises
    RunConflict. An identical graph+target already in flight for the owner is returned instead of
    a new run (coalescing). Nothing is stored when validation fails.
    """
    normalised = graph_validate(graph, target=target, max_nodes=settings.INLINE_MAX_GRAPH_NODES)
    order = closure_order(normalised, target)
    _assets_check(owner, normalised, order)
    requirement = _requirement(normalised, order)
    sha = normalised.sha256()
    existing = _existing_run(owner, sha, target, client_run_id)
    if existing is not None:
        return existing, False
    _limit_check(owner)
    try:
        return _run_create(owner, normalised, sha, target, client_run_id, priority, requirement), True
    except IntegrityError:
        # A concurrent submit of the same clientRunId or graph won the race: answer with its run.
        existing = _existing_run(owner, sha, target, client_run_id)
        if existing is None:
            raise
        return existing, False


def _existing_run(owner: User, sha: str, target: str, client_run_id: str | None) -> Run | None:
    if client_run_id:
        run = Run.objects.select_related("graph").filter(
            owner=owner, client_run_id=client_run_id
        ).first()
        if run is not None:
            if run.graph.sha256 != sha or run.target != target:
                raise RunConflict(
                    f"clientRunId {client_run_id!r} was already used for a different graph or target"
                )
            return run
    return Run.objects.filter(
        owner=owner, graph__sha256=sha, target=target, status__in=IN_FLIGHT
    ).first()


def _limit_check(owner: User) -> None:
    limits = getattr(owner, "limits", None)
    limit = limits.max_inflight_runs if limits else settings.INLINE_MAX_INFLIGHT_RUNS_PER_USER
    if Run.objects.filter(owner=owner, status__in=IN_FLIGHT).count() >= limit:
        raise RunLimitReached(f"you have {limit} runs in flight; wait for some to finish")


@transaction.atomic
def _run_create(
    owner: User, graph: GraphDoc, sha: str, target: str,
    client_run_id: str | None, priority: int, requirement: dict[str, Any],
) -> Run:
    stored, _ = Graph.objects.get_or_create(sha256=sha, defaults={"document": graph.model_dump()})
    run = Run.objects.create(
        owner=owner, graph=stored, target=target, client_run_id=client_run_id or None,
        priority=priority, requirement=requirement, queue=queue_for(requirement),
    )
    transaction.on_commit(dispatch_soon)
    return run


def _assets_check(owner: User, graph: GraphDoc, order: list[str]) -> None:
    refs = list(param_refs(graph, order, "asset"))
    wanted = [str(value) for _, _, value in refs if is_uuid(value)]
    visible = assets_visible_to_owner(owner_id=owner.pk, asset_ids=wanted) if wanted else set()
    for node_id, param, value in refs:
        if str(value) not in visible:
            raise GraphInvalid(
                "asset_not_found", f"param {param.name!r}: no asset {value!r} (upload it first)",
                node_id,
            )


def _requirement(graph: GraphDoc, order: list[str]) -> dict[str, Any]:
    """What a worker must offer: the node types and the model files the closure names."""
    catalog = model_catalog()
    models = []
    for node_id, param, value in param_refs(graph, order, "model"):
        folder = param.options_from or ""
        if value not in catalog.get(folder, []):
            raise GraphInvalid(
                "model_not_found",
                f"param {param.name!r}: no live worker holds {folder}/{value}; put the file in "
                f"the models dir under {folder}/ on a worker",
                node_id,
            )
        models.append({"folder": folder, "name": value})
    types = sorted({graph.nodes[n].type for n in order})
    return {"nodeTypes": types, "models": models}


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
    run.refresh_from_db()
    if not cancelled and run.status != RunStatus.CANCELLED:
        raise RunNotCancellable(f"run {run.pk} already {run.status}")
    return run


# --- the worker's side ------------------------------------------------------------------------

def run_claim(*, run_id: str, worker: str) -> Claim | None:
    """Take a queued run for `worker` (compare-and-set); None if someone else has it or it ended.

    A duplicate delivery of a run id lands here and gets None: it never executes twice.
    """
    now = timezone.now()
    with transaction.atomic():
        won = run_move(
            Run.objects.filter(pk=run_id), source=[RunStatus.QUEUED], to=RunStatus.RUNNING,
            attempts=F("attempts") + 1, lease_worker=worker,
            lease_expires_at=now + _lease(), started_at=Coalesce("started_at", now),
            dispatched_at=None,
        )
        if not won:
            return None
        run = Run.objects.select_related("graph").get(pk=run_id)
        run_event_append(run_id=run.pk, type="status", payload={
            "status": RunStatus.RUNNING, "attempt": run.attempts, "worker": worker,
        })
    return Claim(str(run.pk), run.attempts, run.owner_id, run.target, run.graph.sha256,
                 run.graph.document)


def run_lease_renew(*, run_id: str, attempt: int) -> bool:
    """Extend the lease of our attempt; False means the run was cancelled or reassigned."""
    return bool(
        Run.objects.filter(pk=run_id, status=RunStatus.RUNNING, attempts=attempt).update(
            lease_expires_at=timezone.now() + _lease()
        )
    )


def run_is_current(*, run_id: str, attempt: int) -> bool:
    """Whether our attempt still owns the run (not cancelled, not reaped and retried)."""
    return Run.objects.filter(pk=run_id, status=RunStatus.RUNNING, attempts=attempt).exists()


def run_finish(
    *, run_id: str, attempt: int, status: str, error: dict[str, str] | None = None
) -> bool:
    """Record the outcome of our attempt (fenced by `attempt`); False if we no longer own it."""
    error = error or {}
    with transaction.atomic():
        done = run_move(
            Run.objects.filter(pk=run_id, attempts=attempt), source=[RunStatus.RUNNING], to=status,
            finished_at=timezone.now(), lease_expires_at=None,
            error_code=error.get("code", ""), error_message=error.get("message", ""),
            error_node=error.get("nodeId") or "",
        )
        if done:
            run_event_append(run_id=run_id, type="run_done", payload=run_done_payload(run_id))
            transaction.on_commit(dispatch_soon)
    return bool(done)


def _lease() -> timedelta:
    return timedelta(seconds=settings.INLINE_LEASE_SECONDS)


def dispatch_soon() -> None:
    """Run the dispatcher now (called after commit of a new or finished run)."""
    from apps.runs.dispatch import runs_dispatch

    runs_dispatch()
