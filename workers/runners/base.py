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


@dataclass
class TakeRequest:
    """An image a node asks the executor to keep as a take (written after the node returns)."""

    image: Any  # PIL.Image.Image
    metadata: dict[str, Any] = field(default_factory=dict)


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
    report_progress: Callable[[int, int, bytes | None, int | None], None]
    lineage: dict[str, Any] = field(default_factory=dict)
    takes: list[TakeRequest] = field(default_factory=list)

    def progress(self, step: int, total: int, preview_png: bytes | None = None,
                 batch: int | None = None) -> None:
        """Report `step` of `total` for this node; raises RunCancelled once the run is not ours.

        `batch`: how many jobs (runs) shared the forward that made this step, for samplers.
        (The executor's report is fenced by the attempt, so it is also the cancellation check.)
        """
        self.report_progress(step, total, preview_png, batch)

    def note_lineage(self, **facts: Any) -> None:
        """Record facts (seed, model file hashes, …) that end up in every downstream take."""
        self.lineage.update(facts)

    def keep_take(self, image: Any, **metadata: Any) -> None:
        self.takes.append(TakeRequest(image=image, metadata=metadata))
