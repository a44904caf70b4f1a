"""A cancel reaches the worker while its step is in flight, and the worker takes no further step.

Worker side, in this process, on the real database (committed data, as a NOTIFY needs): a real
`Presence` (its heartbeat thread LISTENs for stop notifications), `attempt_run` on one slot
(claim → executor → zimage/turbo on the tiny stack → record → release) and `run_cancel` from
another thread, as the web would (tests/workers/helpers.py `sampling_slot`).

Deterministic: a forward pre-hook on the loaded transformer counts the forwards (one per step
for one job) and holds step HOLD_AT in flight until the test has cancelled and seen the worker
learn of it. Everything else that could also stop the run is pushed out of the way for the
test's length — no heartbeat (so no lease renewal), no ownership query (FRESH_SECONDS), no event
flush (a fenced write) — so the only thing that tells the worker is the cancel's NOTIFY.
"""

from __future__ import annotations

from typing import Any

from tests.workers.conftest import SmokeStack
from tests.workers.helpers import StepGate, sampling_slot

HOLD_AT = 3


def test_a_cancel_stops_sampling_within_one_step_and_frees_the_slot(
    quiet_slot: Any, smoke_stack: SmokeStack, django_db_setup: None, db_access: None,
):
    from apps.runs.models import Run, RunEvent
    from apps.runs.services import run_cancel

    quiet_slot.INLINE_EVENT_FLUSH_SECONDS = 600  # events stay buffered: no fenced write stops it
    gate = StepGate(HOLD_AT)
    with sampling_slot(smoke_stack, gate, "cancel") as s:
        assert gate.reached.wait(120), "sampling never reached the held step"
        [held] = s.me.held()
        done_before_cancel = gate.forwards - 1  # step HOLD_AT is in flight

        run_cancel(run=Run.objects.get(pk=s.run.pk))
        told = held.lost.wait(30)  # the NOTIFY, delivered while the step is still in flight

    assert told, "the worker never heard of the cancel while its step was in flight"
    assert not s.slot.is_alive() and s.outcome == ["cancelled"]
    steps_after_cancel = gate.forwards - done_before_cancel
    assert steps_after_cancel <= 1, f"{steps_after_cancel} steps after the cancel"
    assert s.me.held() == []  # the slot is free
    run = s.run
    run.refresh_from_db()
    assert run.status == "cancelled" and not run.takes.exists()
    done = RunEvent.objects.get(run=run, type="run_done")
    assert not RunEvent.objects.filter(run=run, seq__gt=done.seq).exists()
