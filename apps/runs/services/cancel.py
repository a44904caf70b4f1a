"""Cancelling a run, and telling the worker that holds a run to stop."""

from __future__ import annotations

from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from apps.runs.dispatch import dispatch_after_commit
from apps.runs.events import run_event_append
from apps.runs.models import IN_FLIGHT, Run, RunStatus
from apps.runs.transitions import run_move
from apps.runs.wire import run_done_payload


class RunNotCancellable(Exception):
    """The run already finished (succeeded or failed)."""


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
