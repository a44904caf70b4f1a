"""Sampling progress carries a preview at most every INLINE_PREVIEW_SECONDS (workers/runners/
diffusion.py): 0 means every step but the last, a negative value none, and a long interval
only the first step's."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from workers.runners import diffusion  # noqa: F401  (registers the runners)
from workers.runners.base import RUNNERS

STEPS = 6


@dataclass
class PreviewRecorder:
    steps: list[tuple[int, bool]] = field(default_factory=list)  # (step, carried a preview)

    def report(self, step: int, total: int, preview: bytes | None, batch: int | None = None) -> None:
        if preview is not None:
            assert preview.startswith(b"\x89PNG"), "a preview is a PNG"
        self.steps.append((step, preview is not None))

    def check_cancelled(self) -> None:
        pass


def previews_at(smoke_stack: Any, cpu_policy: Any, settings: Any, seconds: float) -> list[int]:
    from workers.runners.base import NodeContext

    settings.INLINE_PREVIEW_SECONDS = seconds
    recorder = PreviewRecorder()
    ctx = NodeContext(run_id="r", node_id="gen", node_type="zimage/turbo", graph_sha256="0" * 64,
                      models_dir=smoke_stack.models_dir, owner_id=1, policy=cpu_policy,
                      check_cancelled=recorder.check_cancelled, report_progress=recorder.report)
    params = {"prompt": "a kite", "negative_prompt": "", "width": 64, "height": 48,
              "steps": STEPS, "guidance": 0.0, "seed": 5, "strength": 0.6,
              **smoke_stack.names}
    RUNNERS["zimage/turbo"](ctx, params, {})
    assert [step for step, _ in recorder.steps] == list(range(1, STEPS + 1))
    return [step for step, preview in recorder.steps if preview]


@pytest.mark.parametrize(("seconds", "expected"), [
    (0, list(range(1, STEPS))),  # every step but the last (the take itself follows)
    (-1, []),  # previews off
    (3600, [1]),  # the first step, then none within the interval
])
def test_previews_follow_the_interval(smoke_stack, cpu_policy, settings, seconds, expected):
    assert previews_at(smoke_stack, cpu_policy, settings, seconds) == expected


def test_a_preview_is_encoded_off_the_device_thread(smoke_stack, cpu_policy, settings, monkeypatch):
    """The device thread computes the preview's pixels and nothing else: every slot's next
    step waits on that thread, and a PNG needs no device."""
    import threading

    from workers import png
    from workers.device.thread import THREAD_PREFIX

    threads: list[str] = []
    encode = png.png_encode

    def recorded(*args: Any, **kwargs: Any) -> bytes:
        threads.append(threading.current_thread().name)
        return encode(*args, **kwargs)

    monkeypatch.setattr(png, "png_encode", recorded)
    assert previews_at(smoke_stack, cpu_policy, settings, 0) == list(range(1, STEPS))
    assert len(threads) == STEPS - 1
    assert not any(name.startswith(THREAD_PREFIX) for name in threads), threads
