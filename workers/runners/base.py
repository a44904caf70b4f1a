"""The runner contract: how a node type's code is called by the executor.

A runner is a plain function `(ctx, params, inputs) -> outputs` registered for one node type:
- `params`: the node's params after validation, defaults filled in (plain JSON values);
- `inputs`: input port name -> the upstream output value (PIL images, loaded models, tensors…);
- returns: output port name -> value, one entry per declared output port.
Runners never pick a device or dtype: they ask `ctx.policy.placement(role)`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Runner = Callable[["NodeContext", dict[str, Any], dict[str, Any]], dict[str, Any]]

RUNNERS: dict[str, Runner] = {}

# A lazy node's chooser: (params, its computed non-lazy inputs) -> the lazy inputs it needs.
Chooser = Callable[[dict[str, Any], dict[str, Any]], frozenset[str]]
CHOOSERS: dict[str, Chooser] = {}


class RunCancelled(Exception):
    """The run was cancelled (or lost its lease) while a node was working; stop promptly."""


class NodeFailed(Exception):
    """A node cannot do its work; the message is shown to the user as the run's error."""


def runner(node_type: str) -> Callable[[Runner], Runner]:
    """Register `fn` as the runner of `node_type` (one runner per type)."""

    def register(fn: Runner) -> Runner:
        if node_type in RUNNERS:
            raise RuntimeError(f"two runners registered for {node_type!r}")
        RUNNERS[node_type] = fn
        return fn

    return register


def chooser(node_type: str) -> Callable[[Chooser], Chooser]:
    """Register `fn` as the chooser of a node type with lazy inputs (its descriptor's `lazy`):
    the executor asks it which of them to compute, and never computes the others."""

    def register(fn: Chooser) -> Chooser:
        if node_type in CHOOSERS:
            raise RuntimeError(f"two choosers registered for {node_type!r}")
        CHOOSERS[node_type] = fn
        return fn

    return register


@dataclass
class TakeRequest:
    """An image or a clip a node asks the executor to keep as a take (written after the node
    returns), encoded as `format`: png, webp, jpeg (`quality` for the lossy two) for an image;
    mp4, webm (`crf`) or webp-animated (`quality`, `lossless`) for a `video`."""

    image: Any  # PIL.Image.Image; None for a clip
    metadata: dict[str, Any] = field(default_factory=dict)
    format: str = "png"
    quality: int = 90
    video: Any = None  # workers.models.values.Video
    crf: int = 19
    lossless: bool = False


@dataclass
class NodeContext:
    """What a runner may use besides its params and inputs. Built by the executor per node."""

    run_id: str
    node_id: str
    node_type: str
    graph_sha256: str
    models_dir: Path
    owner_id: int
    policy: Any  # workers.device.policy.DevicePolicy (typed loosely: imported lazily)
    check_cancelled: Callable[[], None]
    # (step, total, preview PNG, batch[, frames]): frames only for video samplers
    report_progress: Callable[..., None]
    lineage: dict[str, Any] = field(default_factory=dict)
    takes: list[TakeRequest] = field(default_factory=list)
    shown: list[Any] = field(default_factory=list)  # values shown on the run (util/preview)

    def progress(self, step: int, total: int, preview_png: bytes | None = None,
                 batch: int | None = None, frames: int | None = None) -> None:
        """Report `step` of `total` for this node; raises RunCancelled once the run is not ours.

        `batch`: how many jobs (runs) shared the forward that made this step, for samplers;
        `frames`: the frames of the clip a video sampler is making (None for an image).
        (The executor's report is fenced by the attempt, so it is also the cancellation check.)
        """
        if frames is None:
            self.report_progress(step, total, preview_png, batch)
        else:
            self.report_progress(step, total, preview_png, batch, frames)

    def note_lineage(self, **facts: Any) -> None:
        """Record facts (seed, model file hashes, …) that end up in every downstream take."""
        self.lineage.update(facts)

    def keep_take(self, image: Any, *, format: str = "png", quality: int = 90,
                  **metadata: Any) -> None:
        self.takes.append(TakeRequest(image=image, metadata=metadata, format=format,
                                      quality=quality))

    def keep_video_take(self, video: Any, *, format: str, crf: int = 19, quality: int = 80,
                        lossless: bool = False, **metadata: Any) -> None:
        """Keep `video` (workers.models.values.Video) as a take: mp4, webm or webp-animated."""
        self.takes.append(TakeRequest(image=None, metadata=metadata, format=format,
                                      quality=quality, video=video, crf=crf, lossless=lossless))

    def show_value(self, value: Any) -> None:
        """Show `value` (text, a number, a bool) on the run: its node_done and `values`."""
        self.shown.append(value)
