"""The run event log: append durably, then publish to the run's channel group after commit."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from django.db import connection, transaction
from django.db.models import F

from apps.runs.models import Run, RunEvent, RunStatus
from inline_farm.effects import group_send_after_commit


def run_group(run_id: Any) -> str:
    """The channel-layer group that websocket clients of a run listen on."""
    return f"run.{run_id}"


def event_to_wire(event: RunEvent) -> dict[str, Any]:
    return {**event.payload, "type": event.type, "runId": str(event.run_id), "seq": event.seq}


@transaction.atomic
def run_event_append(
    *, run_id: Any, type: str, payload: dict[str, Any], fence_attempt: int | None = None
) -> RunEvent | None:
    """Append an event with the run's next seq (the UPDATE locks the run row until commit).

    With `fence_attempt`, the event is appended only while that attempt still owns the running
    run, and None is returned otherwise: a cancelled or reaped attempt writes nothing after the
    run's `run_done`.
    """
    runs = Run.objects.filter(pk=run_id)
    if fence_attempt is not None:
        runs = runs.filter(status=RunStatus.RUNNING, attempts=fence_attempt)
    if not runs.update(last_seq=F("last_seq") + 1):
        return None
    seq = Run.objects.values_list("last_seq", flat=True).get(pk=run_id)
    return events_insert(run_id=run_id, first_seq=seq, events=[(type, payload)])[0]


_FENCED_BUMP = f"""
UPDATE runs_run SET last_seq = last_seq + %s
WHERE id = %s AND status = '{RunStatus.RUNNING}' AND attempts = %s
RETURNING last_seq
"""


def run_seqs_reserve(*, run_id: Any, attempt: int, count: int) -> int | None:
    """Reserve `count` seqs for attempt `attempt`'s next events (locking the run row until
    commit); the first of them, or None once the attempt no longer owns the running run. Call
    inside a transaction, then `events_insert` them."""
    with connection.cursor() as cursor:
        cursor.execute(_FENCED_BUMP, [count, run_id, attempt])
        row = cursor.fetchone()
    return None if row is None else int(row[0]) - count + 1


_APPEND_FENCED = f"""
WITH bumped AS (
    UPDATE runs_run SET last_seq = last_seq + jsonb_array_length(%(events)s::jsonb)
    WHERE id = %(run)s::uuid AND status = '{RunStatus.RUNNING}' AND attempts = %(attempt)s
    RETURNING last_seq)
INSERT INTO runs_runevent (run_id, seq, type, payload, created_at)
SELECT %(run)s::uuid, b.last_seq - jsonb_array_length(%(events)s::jsonb) + e.n, e.doc->>0,
       e.doc->1, now()
FROM bumped b, jsonb_array_elements(%(events)s::jsonb) WITH ORDINALITY AS e(doc, n)
RETURNING seq
"""


def events_doc(events: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """Events as one JSON parameter, `[[type, payload], …]`, that a statement unpacks with
    `jsonb_array_elements(…) WITH ORDINALITY AS e(doc, n)` (type `e.doc->>0`, payload
    `e.doc->1`). psycopg dumps a list parameter element by element in Python: for a finish's
    arrays that was ~90 µs of a worker's CPU, one `json.dumps` is ~3 µs."""
    return json.dumps([[t, p] for t, p in events])


def run_events_append_fenced(
    *, run_id: Any, attempt: int, events: Sequence[tuple[str, dict[str, Any]]]
) -> list[int] | None:
    """Append events of attempt `attempt` with the run's next seqs; their seqs, or None (nothing
    written) once the attempt no longer owns the running run. Publishes them after commit.

    One statement, atomic on its own (the seq bump and the rows together), so outside a
    transaction it is one round trip: a worker's progress flush is its most frequent write, and
    BEGIN, the bump, the insert and COMMIT were four (bench/events.py: the publishing workers'
    round trips and GIL time were the tail of publish → receive)."""
    if not events:
        return []
    with connection.cursor() as cursor:
        cursor.execute(_APPEND_FENCED, {"run": str(run_id), "attempt": attempt,
                                        "events": events_doc(events)})
        seqs = sorted(row[0] for row in cursor.fetchall())
    if not seqs:
        return None
    events_publish(run_id, [{**p, "type": t, "runId": str(run_id), "seq": seq}
                      for seq, (t, p) in zip(seqs, events, strict=True)])
    return seqs


_EVENTS_INSERT = """
INSERT INTO runs_runevent (run_id, seq, type, payload, created_at)
SELECT %(run)s, %(first)s + e.n - 1, e.doc->>0, e.doc->1, now()
FROM jsonb_array_elements(%(events)s::jsonb) WITH ORDINALITY AS e(doc, n)
RETURNING seq, id, created_at
"""


def events_insert(
    *, run_id: Any, first_seq: int, events: Sequence[tuple[str, dict[str, Any]]]
) -> list[RunEvent]:
    """Insert events with seqs first_seq, first_seq+1, … (the caller reserved them on the run
    row, which it holds locked) and publish them to the run's group after commit — as one
    channel message however many there are (a channel-layer send costs several Redis round
    trips; a worker's flush carries many events).

    One statement: the ORM's bulk_create quoted every payload into the SQL text in
    Python, ~1/8 of a worker's CPU on quick runs (py-spy, bench/hotpath.py)."""
    if not events:
        return []
    seqs = [first_seq + i for i in range(len(events))]
    with connection.cursor() as cursor:
        cursor.execute(_EVENTS_INSERT, {"run": run_id, "first": first_seq,
                                        "events": events_doc(events)})
        made = {seq: (pk, created) for seq, pk, created in cursor.fetchall()}
    rows = []
    for seq, (type, payload) in zip(seqs, events, strict=True):
        pk, created = made[seq]
        rows.append(RunEvent.from_db(connection.alias, _EVENT_FIELDS,
                                     (pk, run_id, seq, type, payload, created)))
    events_publish(run_id, [event_to_wire(event) for event in rows])
    return rows


def events_publish(run_id: Any, wire: list[dict[str, Any]]) -> None:
    """Send events to the run's group after commit, as one channel message."""
    message = ({"type": "run.event", "event": wire[0]} if len(wire) == 1
               else {"type": "run.events", "events": wire})
    group_send_after_commit(run_group(run_id), message)


_EVENT_FIELDS = ["id", "run_id", "seq", "type", "payload", "created_at"]
