"""Fixtures for the worker-side tests: a tiny Z-Image stack in a tmp models dir, node contexts.

No database: these tests run with `-p no:django` or beside pytest-django.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from workers.device.policy import DevicePolicy
from workers.runners.base import NodeContext, RunCancelled


@dataclass
class SmokeStack:
    models_dir: Path
    names: dict[str, str]  # model, vae, text_encoder


@dataclass
class Recorder:
    """What a node reported: progress calls, each one's `batch` (0 when none: pass a list to
    share it between runs), and a switch that cancels the run."""

    progress: list[tuple[int, int]] = field(default_factory=list)
    cancel_after_step: int | None = None
    frames: list[int | None] = field(default_factory=list)  # a video sampler's, per report
    batches: list[int] = field(default_factory=list)

    def record(self, step: int, total: int, preview: bytes | None, batch: int | None = None,
               frames: int | None = None) -> None:
        """The context's report_progress: notes a video sampler's `frames`, then `report`."""
        self.frames.append(frames)
        self.report(step, total, preview, batch)

    def report(self, step: int, total: int, preview: bytes | None, batch: int | None = None) -> None:
        self.progress.append((step, total))
        self.batches.append(batch or 0)

    def check_cancelled(self) -> None:
        if (
            self.cancel_after_step is not None
            and self.progress
            and self.progress[-1][0] >= self.cancel_after_step
        ):
            raise RunCancelled("cancelled by the test")


@pytest.fixture(scope="session")
def smoke_stack(tmp_path_factory: pytest.TempPathFactory) -> SmokeStack:
    from workers.models.zimage.tiny import write_smoke_stack

    models_dir = tmp_path_factory.mktemp("models")
    return SmokeStack(models_dir, write_smoke_stack(models_dir))


@pytest.fixture(scope="session")
def cpu_policy() -> DevicePolicy:
    return DevicePolicy(profile="cpu")


@pytest.fixture
def make_ctx(smoke_stack: SmokeStack, cpu_policy: DevicePolicy) -> Callable[..., NodeContext]:
    """make_ctx(recorder=None, models_dir=None) -> a NodeContext on the CPU policy."""

    def make(recorder: Recorder | None = None, models_dir: Path | None = None) -> NodeContext:
        recorder = recorder or Recorder()
        return NodeContext(
            run_id="run-1",
            node_id="node-1",
            node_type="test",
            graph_sha256="0" * 64,
            models_dir=models_dir or smoke_stack.models_dir,
            owner_id=1,
            policy=cpu_policy,
            check_cancelled=recorder.check_cancelled,
            report_progress=recorder.record,
        )

    return make


@pytest.fixture(scope="session")
def txt2img_pipeline():
    from workers.models.zimage.tiny import smoke_pipeline

    return smoke_pipeline()


@pytest.fixture(scope="session")
def img2img_pipeline():
    from workers.models.zimage.tiny import smoke_pipeline

    return smoke_pipeline(img2img=True)


@pytest.fixture
def quiet_slot(settings: Any, smoke_stack: SmokeStack, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Settings for one in-process slot (tests/workers/helpers.py `sampling_slot`) that nothing
    else tells anything: no heartbeat (so no lease renewal), no ownership query. Needs
    pytest-django; returns its `settings` for the test's own changes."""
    from workers.executor import CancelCheck

    settings.INLINE_MODELS_DIR = smoke_stack.models_dir
    settings.INLINE_WORKER_HEARTBEAT = 600  # the presence thread only listens
    settings.INLINE_LEASE_SECONDS = 600
    monkeypatch.setattr(CancelCheck, "FRESH_SECONDS", 600.0)
    return settings
