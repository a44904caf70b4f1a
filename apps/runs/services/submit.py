"""Submitting a run: validate, route, then under the owner's lock the clientRunId, coalescing
and in-flight checks, the graph upsert and the insert — one transaction; the queue is
dispatched after its commit."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, connection, transaction

from apps.fleet.routing import RunCannotFit, need_estimate, parallel_request
from apps.fleet.selectors import LiveFleet
from apps.graphs.families import activation_for, fleet_files, graph_families_check
from apps.graphs.models import Graph
from apps.graphs.schema import GraphDoc
from apps.graphs.validation import GraphInvalid, closure_order, graph_validate, param_refs
from apps.runs.dispatch import dispatch_after_commit
from apps.runs.models import IN_FLIGHT, ClientRunKey, Run, RunStatus
from apps.takes.selectors import assets_visible_to_owner
from inline_farm.ids import is_uuid

# Advisory-lock namespaces (pg_advisory_xact_lock(namespace, key)); the dispatcher's is
# apps/runs/dispatch.py LOCK_QUEUE_DISPATCH.
LOCK_OWNER_SUBMIT = 1
LOCK_TEAM_SUBMIT = 3


class RunConflict(Exception):
    """A clientRunId was reused with a different graph or target."""


class RunLimitReached(Exception):
    """The owner has too many runs in flight."""


class RunPriorityNotAllowed(Exception):
    """The owner asked for a priority above the one staff allow them."""


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
    _assets_check(owner, list(param_refs(normalised, order, "asset")))
    requirement, queue = _requirement(normalised, order)
    _priority_check(owner, priority)
    sha = normalised.sha256()
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


def advisory_lock(namespace: int, key: int) -> None:
    """Take a transaction-scoped advisory lock (call inside `transaction.atomic()`)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [namespace, key])


_IN_FLIGHT = f"""
SELECT (SELECT r.id FROM runs_run r JOIN graphs_graph g ON g.id = r.graph_id
        WHERE r.owner_id = %(owner)s AND g.sha256 = %(sha)s AND r.target = %(target)s
          AND r.status IN ('{RunStatus.QUEUED}', '{RunStatus.RUNNING}') LIMIT 1),
       (SELECT count(*) FROM runs_run WHERE owner_id = %(owner)s
          AND status IN ('{RunStatus.QUEUED}', '{RunStatus.RUNNING}'))
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
    with connection.cursor() as cursor:
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
    with connection.cursor() as cursor:
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
