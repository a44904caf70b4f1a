"""Submitting a run: validate, route, then under the owner's lock the clientRunId, coalescing
and in-flight checks, the graph upsert and the insert — one transaction; the queue is
dispatched after its commit."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, connection, transaction

from apps.accounts.selectors import owner_visible_params
from apps.fleet.routing import RunCannotFit, need_estimate, parallel_request
from apps.fleet.selectors import LiveFleet
from apps.graphs.families import activation_for, fleet_files, graph_families_check
from apps.graphs.models import Graph
from apps.graphs.nodes_qwen import QWEN21_IMAGE_PORTS
from apps.graphs.schema import GraphDoc
from apps.graphs.validation import GraphInvalid, closure_order, graph_validate, param_refs
from apps.runs.dispatch import dispatch_after_commit
from apps.runs.models import IN_FLIGHT, ClientRunKey, Run, RunStatus
from apps.takes.selectors import ASSETS_VISIBLE
from inline_farm.ids import is_uuid
from workers.models.flux1 import KONTEXT_RESOLUTIONS  # torch-free: the family's facts

# Advisory-lock namespaces (pg_advisory_xact_lock(namespace, key)); the dispatcher's is
# apps/runs/dispatch.py LOCK_QUEUE_DISPATCH.
LOCK_OWNER_SUBMIT = 1
LOCK_TEAM_SUBMIT = 3

AssetRef = tuple[str, Any, Any]  # (node id, param, value): `param_refs(…, "asset")`


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
    assets = list(param_refs(normalised, order, "asset"))
    requirement, queue = _requirement(normalised, order)
    _priority_check(owner, priority)
    sha = normalised.sha256()
    try:
        return _run_create_or_find(owner, normalised, sha, target, client_run_id, priority,
                                   requirement, queue, assets=assets)
    except IntegrityError:
        # Another owner's submit of the same new graph document won the insert: look again.
        return _run_create_or_find(owner, normalised, sha, target, client_run_id, priority,
                                   requirement, queue, assets=assets)


@transaction.atomic
def _run_create_or_find(
    owner: User, graph: GraphDoc, sha: str, target: str,
    client_run_id: str | None, priority: int, requirement: dict[str, Any], queue: str,
    *, assets: list[AssetRef] | None = None,
) -> tuple[Run, bool]:
    # One owner's submits take turns (a transaction-scoped advisory lock): the in-flight limit,
    # coalescing and clientRunId checks below then see every earlier submit of that owner.
    advisory_lock(LOCK_OWNER_SUBMIT, owner.pk)
    if client_run_id:
        keyed = _client_run(owner, sha, target, client_run_id)
        if keyed is not None:
            return keyed, False
    state = _submit_state(owner, sha, target, graph, assets or [])
    _assets_found(assets or [], state.assets)  # a miss raises: the transaction writes nothing
    if state.same is not None:
        return _coalesced(owner, sha, target, client_run_id, state.same), False
    _limit_check(owner, state.in_flight, state.team_limits)
    run = Run.objects.create(
        owner=owner, graph_id=state.graph_id, target=target,
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


def _client_run(owner: User, sha: str, target: str, client_run_id: str) -> Run | None:
    """The run an earlier submit with this clientRunId got (RunConflict when that was another
    graph or target), or None. Hold the owner's lock."""
    key = ClientRunKey.objects.select_related("run").filter(owner=owner, key=client_run_id).first()
    if key is None:
        return None
    if key.graph_sha256 != sha or key.target != target:
        raise RunConflict(
            f"clientRunId {client_run_id!r} was already used for a different graph or target"
        )
    return key.run


def _coalesced(owner: User, sha: str, target: str, client_run_id: str | None,
               run_id: Any) -> Run:
    """The run in flight this submit joins (its clientRunId, if any, recorded for that run)."""
    run = Run.objects.get(pk=run_id)
    if client_run_id:
        ClientRunKey.objects.create(owner=owner, key=client_run_id, run=run, graph_sha256=sha,
                                    target=target)
    return run


@dataclass(frozen=True)
class SubmitState:
    """What a submit decides on, read in one statement under the owner's lock."""

    same: Any  # the id of the owner's run of the same graph+target in flight, or None
    in_flight: int  # the owner's runs queued or running
    team_limits: list[tuple[int, str, int]]  # (id, name, limit) of the owner's limited teams
    graph_id: int  # the stored graph of this content hash (inserted now on first use)
    assets: dict[str, str]  # the referenced assets the owner may use → their media types


# Everything a submit reads, and the graph upsert, in one round trip after the owner's lock
# (its snapshot, taken after the lock was granted, sees every earlier submit of the owner). The
# graph is upserted whatever the checks then decide: a refusal raises and rolls it back with the
# rest of the transaction. Its id comes back NULL when another transaction committed the same
# new document while this insert waited (this statement's snapshot cannot see that row).
_SUBMIT_STATE = f"""
WITH stored AS (
    INSERT INTO graphs_graph (sha256, document, created_at) VALUES (%(sha)s, %(doc)s::jsonb, now())
    ON CONFLICT (sha256) DO NOTHING RETURNING id)
SELECT (SELECT r.id FROM runs_run r JOIN graphs_graph g ON g.id = r.graph_id
        WHERE r.owner_id = %(owner)s AND g.sha256 = %(sha)s AND r.target = %(target)s
          AND r.status IN ('{RunStatus.QUEUED}', '{RunStatus.RUNNING}') LIMIT 1),
       (SELECT count(*) FROM runs_run WHERE owner_id = %(owner)s
          AND status IN ('{RunStatus.QUEUED}', '{RunStatus.RUNNING}')),
       (SELECT json_agg(json_build_array(t.id, t.name, t.max_inflight_runs))
          FROM accounts_team t JOIN accounts_team_members m ON m.team_id = t.id
          WHERE m.user_id = %(owner)s AND t.max_inflight_runs IS NOT NULL),
       (SELECT id FROM stored UNION ALL
        SELECT id FROM graphs_graph WHERE sha256 = %(sha)s LIMIT 1),
       ({ASSETS_VISIBLE})
"""


def _submit_state(owner: User, sha: str, target: str, graph: GraphDoc,
                  assets: list[AssetRef]) -> SubmitState:
    """`_SUBMIT_STATE` for this submit. Hold the owner's lock."""
    params = {"owner": owner.pk, "sha": sha, "target": target,
              "doc": json.dumps(graph.model_dump()), "ids": _asset_ids(assets),
              **owner_visible_params(owner)}
    with connection.cursor() as cursor:
        cursor.execute(_SUBMIT_STATE, params)
        same, in_flight, teams, graph_id, visible = cursor.fetchone()
    if graph_id is None:  # another transaction committed it after this statement's snapshot
        graph_id = Graph.objects.values_list("pk", flat=True).get(sha256=sha)
    return SubmitState(same=same, in_flight=int(in_flight),
                       team_limits=[(int(i), str(n), int(m)) for i, n, m in teams or []],
                       graph_id=int(graph_id), assets=dict(visible or {}))


def _limits_of(owner: User) -> Any:
    return getattr(owner, "limits", None)  # a UserLimits row, or None for the defaults


def _limit_check(owner: User, in_flight: int, team_limits: list[tuple[int, str, int]]) -> None:
    """The owner's in-flight limit, then each of their teams' (under the team's lock)."""
    limits = _limits_of(owner)
    limit = limits.max_inflight_runs if limits else settings.INLINE_MAX_INFLIGHT_RUNS_PER_USER
    if in_flight >= limit:
        raise RunLimitReached(f"you have {limit} runs in flight; wait for some to finish")
    for team_id, name, team_limit in team_limits:
        advisory_lock(LOCK_TEAM_SUBMIT, team_id)
        busy = Run.objects.filter(owner__teams=team_id, status__in=IN_FLIGHT).count()
        if busy >= team_limit:
            raise RunLimitReached(
                f"team {name!r} has {team_limit} runs in flight; wait for some to finish"
            )


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



def _asset_ids(refs: list[AssetRef]) -> list[str]:
    return [str(value) for _, _, value in refs if is_uuid(value)]


_MEDIA_NAMES = {"video": "a video", "audio": "a sound file (audio)"}


def _assets_found(refs: list[AssetRef], visible: dict[str, str]) -> None:
    """GraphInvalid naming the first node whose asset the owner may not use (or that is gone),
    or whose asset is not the media its param takes (a video where an image goes)."""
    for node_id, param, value in refs:
        media_type = visible.get(str(value))
        if media_type is None:
            raise GraphInvalid(
                "asset_not_found", f"param {param.name!r}: no asset {value!r} (upload it first)",
                node_id,
            )
        if media_type.split("/", 1)[0] != param.media:
            raise GraphInvalid(
                "asset_wrong_media", f"param {param.name!r}: asset {value} is {media_type}; "
                f"this node takes {_MEDIA_NAMES.get(param.media, 'an image')}",
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
    files = fleet_files(fleet.workers)
    families = graph_families_check(graph, order, files)  # 422: mixed
    kinds = [(files[m].family, files[m].variant) for m in sorted(unique) if m in files]
    need = need_estimate(model_sizes=[sizes.get(m, 0) for m in sorted(unique)],
                         pixels=image_pixels(graph, order),
                         activation=activation_for(families, kinds))
    requirement = {"nodeTypes": types, "models": models, "need": need.to_wire(),
                   "families": sorted(families),
                   "parallel": parallel_request(graph.nodes[n].params.get("parallel")
                                                for n in order)}
    try:
        return requirement, fleet.queue_for(requirement)
    except RunCannotFit as exc:
        raise GraphInvalid("run_cannot_fit", str(exc), refs[0][0]) from None


MEGAPIXEL = 1024 * 1024
# Reference images a node hands the transformer beside the image it denoises (their tokens join
# its sequence): its image ports, and the pixels each becomes from the node's params.
REFERENCE_NODES: dict[str, tuple[tuple[str, ...], Any]] = {
    "flux2/reference": (("image", "image_2", "image_3"), lambda params: MEGAPIXEL),  # ≤ 1 MP
    # a Kontext resolution (~1 MP; the largest, 1328×800, counted)
    "flux1/reference": (("image",), lambda params: max(w * h for w, h in KONTEXT_RESOLUTIONS)),
    "qwenimage/edit": (("image", "image_2", "image_3"),  # only with a VAE: reference latents
                       lambda params: round(float(params.get("megapixels", 1.0)) * MEGAPIXEL)),
    # ~resolution² px each (they need the VAE); at resolution 0 each keeps its own size, which
    # is not known at submit: counted at the family's default 1 MP
    "qwenimage21/encode": (QWEN21_IMAGE_PORTS,
                           lambda params: int(params.get("resolution", 1024) or 1024) ** 2),
}


def image_pixels(graph: GraphDoc, order: list[str]) -> int:
    """The pixels a run's denoise holds at once: its largest image, plus every reference image
    its edit nodes hand the transformer (the VRAM estimate counts them)."""
    return _largest_image(graph, order) + _reference_pixels(graph, order)


def _reference_pixels(graph: GraphDoc, order: list[str]) -> int:
    total = 0
    for node_id in order:
        node = graph.nodes[node_id]
        if node.type not in REFERENCE_NODES or (node.type == "qwenimage/edit"
                                                and "vae" not in node.inputs):
            continue
        ports, pixels = REFERENCE_NODES[node.type]
        total += sum(pixels(node.params) for port in ports if port in node.inputs)
    return total


def _largest_image(graph: GraphDoc, order: list[str]) -> int:
    """The most pixels any node of the closure asks for (its width × height params, times its
    `length` frames for a video node: a clip's activations grow with its frames)."""
    largest = 0
    for node_id in order:
        params = graph.nodes[node_id].params
        width, height, length = params.get("width"), params.get("height"), params.get("length")
        if isinstance(width, int) and isinstance(height, int):
            frames = length if isinstance(length, int) and length > 0 else 1
            largest = max(largest, width * height * frames)
    return largest
