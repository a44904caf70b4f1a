"""/v1/runs: submit, read, list, cancel. Front door only: parse, call one service, shape."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from ninja import Query, Router

from apps.runs.schemas import RunIn, RunListOut, RunListQuery, RunOut, RunSubmitOut
from apps.runs.selectors import run_get_for_user, run_list_for_user, runs_to_wire
from apps.runs.services import (
    RunConflict,
    RunLimitReached,
    RunNotCancellable,
    RunPriorityNotAllowed,
    run_cancel,
    run_submit,
)
from apps.runs.wire import run_to_wire
from inline_farm.endpoints import ApiError, caller, errors, respond
from inline_farm.ids import is_uuid

router = Router(tags=["runs"])


@router.post("", summary="Submit a graph run", response={
    200: RunSubmitOut, 201: RunSubmitOut, **errors(401, 403, 409, 413, 422, 429)})
def submit(request: HttpRequest, payload: RunIn) -> HttpResponse:
    try:
        run, created = run_submit(
            owner=caller(request), graph=payload.graph, target=payload.target,
            client_run_id=payload.client_run_id, priority=payload.priority,
        )
    except RunConflict as exc:
        raise ApiError(409, "client_run_id_conflict", str(exc)) from None
    except RunLimitReached as exc:
        raise ApiError(429, "too_many_runs", str(exc)) from None
    except RunPriorityNotAllowed as exc:
        raise ApiError(403, "priority_not_allowed", str(exc)) from None
    body = {"runId": str(run.id), "status": run.status, "created": created}
    return respond(body, status=201 if created else 200)


@router.get("", summary="List my runs", response={200: RunListOut, **errors(401, 422)})
def list_runs(request: HttpRequest, query: Query[RunListQuery]) -> dict[str, Any]:
    qs = run_list_for_user(user=caller(request), status=query.status, mine=query.mine)
    page = list(qs[query.offset : query.offset + query.limit + 1])
    more = len(page) > query.limit
    return {
        "items": runs_to_wire(page[: query.limit]),
        "limit": query.limit,
        "offset": query.offset,
        "nextOffset": query.offset + query.limit if more else None,
    }


@router.get("/{run_id}", summary="Get a run's durable state",
            response={200: RunOut, **errors(401, 404)})
def get_run(request: HttpRequest, run_id: str) -> dict[str, Any]:
    return runs_to_wire([_run_or_404(request, run_id)])[0]


@router.delete("/{run_id}", summary="Cancel a queued or running run",
               response={200: RunOut, **errors(401, 404, 409)})
def cancel_run(request: HttpRequest, run_id: str) -> dict[str, Any]:
    run = _run_or_404(request, run_id)
    try:
        run = run_cancel(run=run)
    except RunNotCancellable as exc:
        raise ApiError(409, "run_finished", str(exc)) from None
    return run_to_wire(run_get_for_user(user=caller(request), run_id=run.pk) or run)


def _run_or_404(request: HttpRequest, run_id: str) -> Any:
    run = run_get_for_user(user=caller(request), run_id=run_id) if is_uuid(run_id) else None
    if run is None:
        raise ApiError(404, "not_found", f"no run {run_id}")
    return run
