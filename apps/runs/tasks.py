"""Control-plane Celery tasks (torch-free): the beat-driven reaper + dispatcher safety net."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="apps.runs.tasks.reap_and_dispatch", ignore_result=True)
def reap_and_dispatch() -> dict[str, int]:
    from apps.runs.recovery import runs_dispatch, runs_reap

    reaped = runs_reap()
    return {"reaped": reaped, "dispatched": runs_dispatch()}
