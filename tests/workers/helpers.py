"""Small helpers shared by the worker tests."""

from __future__ import annotations

import io
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image


def png_bytes(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def pixels(image: Image.Image) -> np.ndarray:
    return np.asarray(image.convert("RGB")).astype(np.int16)


def noise_image(width: int, height: int, seed: int = 0) -> Image.Image:
    rng = np.random.RandomState(seed)
    return Image.fromarray((rng.rand(height, width, 3) * 255).astype("uint8"), "RGB")


# --- one worker slot sampling in this process, with a step held in flight ----------------------
# For the tests that watch what a slot does between two steps (tests/workers/test_cancel_at_step.py,
# tests/workers/test_progress_writes.py): `attempt_run` on a thread, on the real database
# (committed data, as a NOTIFY needs), the tiny stack's transformer hooked.

QUEUE = "cancel-test"  # served by no worker of a live farm: only the test's slot takes its runs


class StepGate:
    """Forward pre-hook: counts forwards; holds forward `hold_at` until `release` is set. With
    `seconds`, every forward first takes that long (a big model's step)."""

    def __init__(self, hold_at: int, seconds: float = 0.0) -> None:
        self.hold_at = hold_at
        self.seconds = seconds
        self.forwards = 0
        self.reached = threading.Event()
        self.release = threading.Event()

    def __call__(self, module: Any, args: Any) -> None:
        if self.seconds:
            time.sleep(self.seconds)
        self.forwards += 1
        if self.forwards == self.hold_at:
            self.reached.set()
            self.release.wait(120)


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"gave up waiting: {what}"
        time.sleep(0.01)


def queued_turbo_run(stack: Any, steps: int = 60) -> Any:
    """A queued zimage/turbo → image/save run of `steps` steps on QUEUE, marked as just
    published (so no dispatcher of a live farm publishes it meanwhile)."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from apps.graphs.models import Graph
    from apps.graphs.schema import GraphDoc
    from apps.graphs.validation import graph_validate
    from apps.runs.models import Run

    doc = graph_validate(GraphDoc.model_validate({"nodes": {
        "gen": {"type": "zimage/turbo", "params": {
            "prompt": "a red kite", "width": 64, "height": 64, "steps": steps, "seed": 3,
            **stack.names}},
        "out": {"type": "image/save", "inputs": {"image": {"node": "gen", "port": "image"}}},
    }}), target="out", max_nodes=100)
    owner = get_user_model().objects.create(username=f"slot-{uuid.uuid4().hex[:8]}")
    graph, _ = Graph.objects.get_or_create(sha256=doc.sha256(),  # content-addressed: shared
                                           defaults={"document": doc.model_dump()})
    return Run.objects.create(owner=owner, graph=graph, target="out", queue=QUEUE,
                              dispatched_at=timezone.now())


@dataclass
class SamplingSlot:
    run: Any  # apps.runs.models.Run
    me: Any  # workers.heartbeat.Presence
    slot: threading.Thread
    outcome: list[str]  # attempt_run's answer, once the slot is done


@contextmanager
def sampling_slot(stack: Any, gate: StepGate, name: str) -> Iterator[SamplingSlot]:
    """A worker presence and one slot running `attempt_run` on a fresh `queued_turbo_run`, with
    `gate` on the transformer the executor will use (the loader's cache: same file, same
    policy). On exit the gate is released, the slot joined, the hook removed, the presence
    stopped."""
    from workers import runtime
    from workers.attempt import attempt_run
    from workers.heartbeat import Presence
    from workers.models.zimage.loading import load_diffusion_model

    model = load_diffusion_model(stack.models_dir, stack.names["model"], runtime.policy())
    hook = model.transformer.register_forward_pre_hook(gate)
    me = Presence(f"{name}-{uuid.uuid4().hex[:6]}@test", [QUEUE], 1)
    me.beat()
    me.start()
    outcome: list[str] = []
    slot: threading.Thread | None = None
    try:
        run = queued_turbo_run(stack)
        slot = threading.Thread(target=lambda: outcome.append(attempt_run(str(run.pk), me)))
        slot.start()
        yield SamplingSlot(run, me, slot, outcome)
    finally:
        gate.release.set()
        if slot is not None:
            slot.join(120)
        hook.remove()
        me.stop()
