"""The run event log: append durably, then publish to the run's channel group after commit."""

from __future__ import annotations

from typing import Any

from django.db import transaction
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
    event = RunEvent.objects.create(run_id=run_id, seq=seq, type=type, payload=payload)
    group_send_after_commit(run_group(run_id), {"type": "run.event", "event": event_to_wire(event)})
    return event
