"""Runs in their wire shape (DESIGN.md: add fields freely, never rename or remove)."""

from __future__ import annotations

from typing import Any

from apps.runs.models import Run
from apps.takes.wire import take_to_wire


def _iso(value: Any) -> str | None:
    return value.isoformat() if value else None


def run_error(run: Run) -> dict[str, Any] | None:
    if not run.error_code:
        return None
    return {"code": run.error_code, "message": run.error_message, "nodeId": run.error_node or None}


def run_to_wire(run: Run, *, waiting: str | None = None) -> dict[str, Any]:
    """The run as clients see it; takes come from a prefetch when the caller made one.
    `waiting` says, for a queued run, why it has not started (apps/runs/selectors.py)."""
    return {
        "id": str(run.id),
        "status": run.status,
        "target": run.target,
        "clientRunId": run.client_run_id,
        "priority": run.priority,
        "queue": run.queue,
        "attempts": run.attempts,
        "graphSha256": run.graph.sha256 if "graph" in run._state.fields_cache else None,
        "createdAt": _iso(run.created_at),
        "startedAt": _iso(run.started_at),
        "finishedAt": _iso(run.finished_at),
        "lastSeq": run.last_seq,
        "error": run_error(run),
        "takes": [take_to_wire(t) for t in run.takes.all()],
        "values": run.shown_values or [],
        "waiting": waiting if run.status == "queued" else None,
        "peakMemoryBytes": run.peak_memory_bytes,
        "estimatedMemoryGb": (run.requirement.get("need") or {}).get("vramGb"),
    }


def run_done_payload(run_id: Any) -> dict[str, Any]:
    """The body of a `run_done` event: final status, takes and error."""
    wire = run_to_wire(Run.objects.prefetch_related("takes").get(pk=run_id))
    return {"status": wire["status"], "takes": wire["takes"], "error": wire["error"],
            "values": wire["values"]}
