"""Reads on runs, always scoped to what the user may see."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.db import connection
from django.db.models import QuerySet

from apps.accounts.selectors import owner_visible_params, owner_visible_sql, visible_owner_ids
from apps.fleet.selectors import queue_wait_reason, queue_wait_reasons, serving_of, serving_params
from apps.graphs.models import Graph
from apps.runs.events import event_to_wire
from apps.runs.models import Run, RunEvent, RunStatus
from apps.runs.wire import run_to_wire
from apps.takes.models import Take
from inline_farm.ids import is_uuid
from inline_farm.rows import model_columns, model_from_row

WAITING = "wait_reason"  # a run read by RUN_VISIBLE while queued: why it waits


def _runs_for(user: User) -> QuerySet[Run]:
    owners = visible_owner_ids(user)
    # The graph's sha256 is on the wire; its document (KiBs of JSON) is not: never load it here.
    qs = Run.objects.select_related("graph").defer("graph__document").prefetch_related("takes")
    return qs if owners is None else qs.filter(owner_id__in=owners)


# Clients poll a run's state; this read is the hottest of the farm (inline_farm/run_door.py
# answers most polls with it). Written out (one
# statement: the run, with one row per take when it has any; no ORM query building: that was
# most of its cost) with the same scoping as `_runs_for`. A queued run's row also says who
# serves its queue (why it waits), where that was a second statement for every such poll.
RUN_VISIBLE = f"""
SELECT {model_columns(Run, "r")}, g.sha256,
       CASE WHEN r.status = '{RunStatus.QUEUED}' THEN {serving_of("r.queue")} END AS serving,
       {model_columns(Take, "t")}
FROM runs_run r JOIN graphs_graph g ON g.id = r.graph_id
LEFT JOIN takes_take t ON t.run_id = r.id
WHERE r.id = %(run)s AND {owner_visible_sql("r.owner_id")}
ORDER BY t.created_at, t.node_id, t.index
"""
_RUN_COLUMNS = len(Run._meta.concrete_fields)
_TAKE_AT = _RUN_COLUMNS + 2  # after the run's columns, the sha256 and `serving`


def run_get_for_user(*, user: User, run_id: Any) -> Run | None:
    """The run `run_id` if `user` may see it (own, a teammate's, or any for staff), with its
    graph's sha256 and its takes loaded; an id not in canonical form names nothing."""
    if not is_uuid(run_id):
        return None
    with connection.cursor() as cursor:
        cursor.execute(RUN_VISIBLE, run_visible_params(user, run_id))
        return run_from_rows(cursor.fetchall())


def run_visible_params(user: User, run_id: Any) -> dict[str, Any]:
    return {"run": run_id, **owner_visible_params(user), **serving_params()}


def run_from_rows(rows: list[tuple[Any, ...]]) -> Run | None:
    """The run of RUN_VISIBLE's rows (None for none), as `run_get_for_user` returns it."""
    if not rows:
        return None
    run = model_from_row(Run, rows[0][:_RUN_COLUMNS])
    run.graph = Graph(pk=run.graph_id, sha256=rows[0][_RUN_COLUMNS])
    serving = rows[0][_RUN_COLUMNS + 1]
    if serving is not None:  # queued: why it waits, for `runs_to_wire`
        setattr(run, WAITING, queue_wait_reason(run.queue, serving))
    takes = [model_from_row(Take, row[_TAKE_AT:]) for row in rows
             if row[_TAKE_AT] is not None]  # a take's id; None: the run has none
    # What prefetch_related("takes") would have set: run.takes.all() answers these.
    setattr(run, "_prefetched_objects_cache", {"takes": takes})  # noqa: B010
    return run


def run_list_for_user(*, user: User, status: str | None = None,
                      mine: bool = False) -> QuerySet[Run]:
    """The runs `user` may see, newest first (`mine`: only those they submitted)."""
    qs = _runs_for(user).order_by("-created_at", "-pk")
    qs = qs.filter(owner_id=user.pk) if mine else qs
    return qs.filter(status=status) if status else qs


def runs_to_wire(runs: list[Run], cursor: Any = None) -> list[dict[str, Any]]:
    """Runs in their wire shape, each queued one with why it waits: as RUN_VISIBLE read it, or
    else from one fleet query for all (on `cursor` when given: `queue_wait_reasons`)."""
    queued = {r.queue for r in runs if r.status == "queued" and not hasattr(r, WAITING)}
    reasons = queue_wait_reasons(queued, cursor) if queued else {}
    return [run_to_wire(r, waiting=getattr(r, WAITING, None) or reasons.get(r.queue))
            for r in runs]


def run_events_after(
    *, run_id: Any, after: int, before: int | None = None, limit: int | None = None
) -> list[RunEvent]:
    """The run's logged events with `after` < seq (< `before`), oldest first, at most `limit`."""
    qs = RunEvent.objects.filter(run_id=run_id, seq__gt=after).order_by("seq")
    if before is not None:
        qs = qs.filter(seq__lt=before)
    return list(qs[:limit] if limit is not None else qs)


def run_events_wire_after(
    *, run_id: Any, after: int, before: int | None = None, limit: int | None = None
) -> list[dict[str, Any]]:
    """`run_events_after` in the wire shape websocket clients receive."""
    events = run_events_after(run_id=run_id, after=after, before=before, limit=limit)
    return [event_to_wire(e) for e in events]


# A websocket's snapshot (apps/runs/stream.py): the run, its takes and its run_done's seq in
# one statement, so in one snapshot of the database. Through the ORM it was three queries
# (the run with its graph's document, its takes, its log) on each socket's open.
_SNAPSHOT = f"""
SELECT {model_columns(Run, "r")}, g.sha256, NULL AS serving, {model_columns(Take, "t")},
       (SELECT e.seq FROM runs_runevent e WHERE e.run_id = r.id AND e.type = 'run_done'
        ORDER BY e.seq LIMIT 1) AS done_seq
FROM runs_run r JOIN graphs_graph g ON g.id = r.graph_id
LEFT JOIN takes_take t ON t.run_id = r.id
WHERE r.id = %(run)s
ORDER BY t.created_at, t.node_id, t.index
"""


def run_snapshot(*, run_id: Any) -> dict[str, Any]:
    """A run's state for a websocket `snapshot`: the run's wire state, and where its log stands.

    `lastSeq` is the newest logged seq when the row was read; `doneSeq` is the seq of its
    `run_done` event (None while it runs). One statement reads all three, so the takes are
    those the log up to `lastSeq` lists (clients dedupe takes by id all the same). Raises
    Run.DoesNotExist for a run that is gone."""
    with connection.cursor() as cursor:
        cursor.execute(_SNAPSHOT, {"run": run_id})
        rows = cursor.fetchall()
    run = run_from_rows([row[:-1] for row in rows])
    if run is None:
        raise Run.DoesNotExist(f"run {run_id} does not exist")
    return {"run": run_to_wire(run), "lastSeq": run.last_seq, "doneSeq": rows[0][-1]}
