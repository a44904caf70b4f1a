"""A cancel reaches the worker while its step is in flight, and the worker takes no further step.

Worker side, in this process, on the real database (committed data, as a NOTIFY needs): a real
`Presence` (its heartbeat thread LISTENs for stop notifications), `attempt_run` on one slot
(claim → executor → zimage/turbo on the tiny stack → record → release) and `run_cancel` from
another thread, as the web would.

Deterministic: a forward pre-hook on the loaded transformer counts the forwards (one per step
for one job) and holds step HOLD_AT in flight until the test has cancelled and seen the worker
learn of it. Everything else that could also stop the run is pushed out of the way for the
test's length — no heartbeat (so no lease renewal), no ownership query (FRESH_SECONDS), no event
flush (a fenced write) — so the only thing that tells the worker is the cancel's NOTIFY.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from tests.workers.conftest import SmokeStack

STEPS, HOLD_AT = 60, 3


class StepGate:
    """Forward pre-hook: counts forwards; holds forward `hold_at` until `release` is set."""

    def __init__(self, hold_at: int) -> None:
        self.hold_at = hold_at
        self.forwards = 0
        self.reached = threading.Event()
        self.release = threading.Event()

    def __call__(self, module: Any, args: Any) -> None:
        self.forwards += 1
        if self.forwards == self.hold_at:
            self.reached.set()
            self.release.wait(120)


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"gave up waiting: {what}"
        time.sleep(0.01)


@pytest.fixture
def quiet(settings: Any, smoke_stack: SmokeStack, monkeypatch: pytest.MonkeyPatch) -> None:
    from workers.executor import CancelCheck

    settings.INLINE_MODELS_DIR = smoke_stack.models_dir
    settings.INLINE_WORKER_HEARTBEAT = 600  # the presence thread only listens
    settings.INLINE_LEASE_SECONDS = 600
    settings.INLINE_EVENT_FLUSH_SECONDS = 600  # events stay buffered: no fenced write stops it
    monkeypatch.setattr(CancelCheck, "FRESH_SECONDS", 600.0)  # no ownership query either


def _queued_turbo_run(stack: SmokeStack) -> Any:
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from apps.graphs.models import Graph
    from apps.graphs.schema import GraphDoc
    from apps.graphs.validation import graph_validate
    from apps.runs.models import Run

    doc = graph_validate(GraphDoc.model_validate({"nodes": {
        "gen": {"type": "zimage/turbo", "params": {
            "prompt": "a red kite", "width": 64, "height": 64, "steps": STEPS, "seed": 3,
            **stack.names}},
        "out": {"type": "image/save", "inputs": {"image": {"node": "gen", "port": "image"}}},
    }}), target="out", max_nodes=100)
    owner = get_user_model().objects.create(username=f"cancel-{uuid.uuid4().hex[:8]}")
    graph, _ = Graph.objects.get_or_create(sha256=doc.sha256(), defaults={"document": doc.model_dump()})
    # Marked as just published, so no dispatcher of a live farm publishes it meanwhile.
    return Run.objects.create(owner=owner, graph=graph, target="out", queue="cancel-test",
                              dispatched_at=timezone.now())


def test_a_cancel_stops_sampling_within_one_step_and_frees_the_slot(
    quiet: None, smoke_stack: SmokeStack, django_db_setup: None,
    db_access: None,
):
    from apps.runs.models import Run, RunEvent
    from apps.runs.services import run_cancel
    from workers import runtime
    from workers.attempt import attempt_run
    from workers.heartbeat import Presence
    from workers.models.zimage.loading import load_diffusion_model

    # The executor loads the same cached model (same file, same policy): hook its transformer.
    model = load_diffusion_model(smoke_stack.models_dir, smoke_stack.names["model"],
                                 runtime.policy())
    gate = StepGate(HOLD_AT)
    hook = model.transformer.register_forward_pre_hook(gate)
    me = Presence(f"cancel-{uuid.uuid4().hex[:6]}@test", ["cancel-test"], 1)
    me.beat()
    me.start()
    outcome: list[str] = []
    slot = threading.Thread(target=lambda: outcome.append(attempt_run(str(run.pk), me)))
    try:
        run = _queued_turbo_run(smoke_stack)
        slot.start()
        assert gate.reached.wait(120), "sampling never reached the held step"
        [held] = me.held()
        done_before_cancel = gate.forwards - 1  # step HOLD_AT is in flight

        run_cancel(run=Run.objects.get(pk=run.pk))
        told = held.lost.wait(30)  # the NOTIFY, delivered while the step is still in flight
        gate.release.set()
        slot.join(120)
    finally:
        gate.release.set()
        hook.remove()
        me.stop()

    assert told, "the worker never heard of the cancel while its step was in flight"
    assert not slot.is_alive() and outcome == ["cancelled"]
    steps_after_cancel = gate.forwards - done_before_cancel
    assert steps_after_cancel <= 1, f"{steps_after_cancel} steps after the cancel"
    assert me.held() == []  # the slot is free
    run.refresh_from_db()
    assert run.status == "cancelled" and not run.takes.exists()
    done = RunEvent.objects.get(run=run, type="run_done")
    assert not RunEvent.objects.filter(run=run, seq__gt=done.seq).exists()
