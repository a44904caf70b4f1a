"""A slot's progress writes: timely for slow steps, and fenced.

Worker side, in this process, on the real database (committed data): `attempt_run` on one slot
(claim → executor → zimage/turbo on the tiny stack), and nothing else that could write or tell
the slot anything — no heartbeat, no ownership query, no cancel. A forward pre-hook holds a
chosen step in flight while the test looks at what PostgreSQL (what a client can be told) has.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from tests.workers.conftest import SmokeStack
from tests.workers.test_cancel_at_step import StepGate, _queued_turbo_run


@pytest.fixture
def quiet_slot(settings: Any, smoke_stack: SmokeStack, monkeypatch: pytest.MonkeyPatch) -> Any:
    from workers.executor import CancelCheck

    settings.INLINE_MODELS_DIR = smoke_stack.models_dir
    settings.INLINE_WORKER_HEARTBEAT = 600  # the presence thread only listens
    settings.INLINE_LEASE_SECONDS = 600
    monkeypatch.setattr(CancelCheck, "FRESH_SECONDS", 600.0)  # no ownership query
    return settings


class SlowSteps(StepGate):
    """StepGate whose every forward first takes `seconds` (a big model's step)."""

    def __init__(self, hold_at: int, seconds: float) -> None:
        super().__init__(hold_at)
        self.seconds = seconds

    def __call__(self, module: Any, args: Any) -> None:
        time.sleep(self.seconds)
        super().__call__(module, args)


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
    from workers import runtime
    from workers.attempt import attempt_run
    from workers.heartbeat import Presence
    from workers.models.zimage.loading import load_diffusion_model

    quiet_slot.INLINE_EVENT_FLUSH_SECONDS = 0.05
    model = load_diffusion_model(smoke_stack.models_dir, smoke_stack.names["model"],
                                 runtime.policy())
    gate = SlowSteps(hold_at=4, seconds=0.15)  # steps 1-3 done, step 4 in flight
    hook = model.transformer.register_forward_pre_hook(gate)
    me = Presence(f"timely-{uuid.uuid4().hex[:6]}@test", ["cancel-test"], 1)
    me.beat()
    me.start()
    outcome: list[str] = []
    slot = None
    try:
        run = _queued_turbo_run(smoke_stack)  # 60 steps
        slot = threading.Thread(target=lambda: outcome.append(attempt_run(str(run.pk), me)))
        slot.start()
        assert gate.reached.wait(120), "sampling never reached the held step"
        written = _steps_written(run)
        run_cancel(run=run)  # the test has what it came for: stop the run at its next step
        gate.release.set()
        slot.join(120)
    finally:
        gate.release.set()
        hook.remove()
        me.stop()

    assert written == [1, 2, 3], f"progress in PostgreSQL while step 4 ran: {written}"
    assert slot is not None and not slot.is_alive() and outcome == ["cancelled"]


def test_a_progress_write_that_finds_the_run_taken_stops_the_attempt_at_that_step(
    quiet_slot: Any, smoke_stack: SmokeStack, django_db_setup: None, db_access: None,
):
    """The reaper requeued the run and another worker claimed it (its `attempts` moved on) while
    this slot sampled: the progress write of the step in flight finds it, and the slot takes
    no further step, writes nothing more and keeps no take."""
    from django.db.models import F

    from apps.runs.models import Run, RunEvent
    from apps.runs.services import run_cancel
    from tests.workers.test_cancel_at_step import wait_for
    from workers import runtime
    from workers.attempt import attempt_run
    from workers.heartbeat import Presence
    from workers.models.zimage.loading import load_diffusion_model

    quiet_slot.INLINE_EVENT_FLUSH_SECONDS = 0  # every event is written as it is made
    model = load_diffusion_model(smoke_stack.models_dir, smoke_stack.names["model"],
                                 runtime.policy())
    gate = StepGate(3)
    hook = model.transformer.register_forward_pre_hook(gate)
    me = Presence(f"fenced-{uuid.uuid4().hex[:6]}@test", ["cancel-test"], 1)
    me.beat()
    me.start()
    outcome: list[str] = []
    try:
        run = _queued_turbo_run(smoke_stack)  # 60 steps
        slot = threading.Thread(target=lambda: outcome.append(attempt_run(str(run.pk), me)))
        slot.start()
        assert gate.reached.wait(120), "sampling never reached the held step"
        wait_for(lambda: RunEvent.objects.filter(run=run, type="progress").count() == 2, 30,
                 "steps 1 and 2 written")
        Run.objects.filter(pk=run.pk).update(attempts=F("attempts") + 1)  # taken by another
        gate.release.set()
        slot.join(120)
    finally:
        gate.release.set()
        hook.remove()
        me.stop()

    assert not slot.is_alive() and outcome == ["cancelled"]
    assert gate.forwards == 3, f"{gate.forwards} forwards: the slot went on past the lost write"
    assert me.held() == []
    run.refresh_from_db()
    assert run.status == "running" and not run.takes.exists()  # the other attempt's to finish
    assert _steps_written(run) == [1, 2]  # written before the run was taken; nothing of this attempt after
    run_cancel(run=run)  # the run "another worker" holds: nobody serves its queue here
