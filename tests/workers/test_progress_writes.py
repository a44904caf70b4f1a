"""A slot's progress writes: timely for slow steps, and fenced.

Worker side, in this process, on the real database (committed data): `attempt_run` on one slot
(claim → executor → zimage/turbo on the tiny stack; tests/workers/helpers.py `sampling_slot`),
and nothing else that could write or tell the slot anything — no heartbeat, no ownership query,
no cancel. A forward pre-hook holds a chosen step in flight while the test looks at what
PostgreSQL (what a client can be told) has.
"""

from __future__ import annotations

from typing import Any

from tests.workers.conftest import SmokeStack
from tests.workers.helpers import StepGate, sampling_slot, wait_for


def _steps_written(run: Any) -> list[int]:
    from apps.runs.models import RunEvent

    return [p["step"] for p in RunEvent.objects.filter(run=run, type="progress")
            .order_by("seq").values_list("payload", flat=True)]


def test_a_slow_steps_progress_is_written_as_the_step_ends(
    quiet_slot: Any, smoke_stack: SmokeStack, django_db_setup: None, db_access: None,
):
    """Steps slower than INLINE_EVENT_FLUSH_SECONDS: each step's progress is in PostgreSQL
    before the next step ends (the flush period limits how often a run writes, it does not hold
    an event back until the next one comes)."""
    from apps.runs.services import run_cancel

    quiet_slot.INLINE_EVENT_FLUSH_SECONDS = 0.05
    gate = StepGate(hold_at=4, seconds=0.15)  # steps 1-3 done, step 4 in flight
    with sampling_slot(smoke_stack, gate, "timely") as s:
        assert gate.reached.wait(120), "sampling never reached the held step"
        written = _steps_written(s.run)
        run_cancel(run=s.run)  # the test has what it came for: stop the run at its next step

    assert written == [1, 2, 3], f"progress in PostgreSQL while step 4 ran: {written}"
    assert not s.slot.is_alive() and s.outcome == ["cancelled"]


def test_a_progress_write_that_finds_the_run_taken_stops_the_attempt_at_that_step(
    quiet_slot: Any, smoke_stack: SmokeStack, django_db_setup: None, db_access: None,
):
    """The reaper requeued the run and another worker claimed it (its `attempts` moved on) while
    this slot sampled: the progress write of the step in flight finds it, and the slot takes
    no further step, writes nothing more and keeps no take."""
    from django.db.models import F

    from apps.runs.models import Run
    from apps.runs.services import run_cancel

    quiet_slot.INLINE_EVENT_FLUSH_SECONDS = 0  # every event is written as it is made
    gate = StepGate(hold_at=3)
    with sampling_slot(smoke_stack, gate, "fenced") as s:
        assert gate.reached.wait(120), "sampling never reached the held step"
        wait_for(lambda: len(_steps_written(s.run)) == 2, 30, "steps 1 and 2 written")
        Run.objects.filter(pk=s.run.pk).update(attempts=F("attempts") + 1)  # taken by another

    run = Run.objects.get(pk=s.run.pk)
    left = (run.status, run.takes.exists(), _steps_written(run))
    run_cancel(run=run)  # before the asserts: nobody serves its queue here
    assert not s.slot.is_alive() and s.outcome == ["cancelled"]
    assert gate.forwards == 3, f"{gate.forwards} forwards: the slot went on past the lost write"
    assert s.me.held() == []
    # The run is the other attempt's to finish; this one kept no take, and of its progress only
    # what was written before the run was taken is there.
    assert left == ("running", False, [1, 2])
