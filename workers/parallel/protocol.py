"""What travels between the Celery process and rank 0 of a group (a local pipe, pickled bytes).

    parent → rank 0:  ("forward", Forward)  ("quit",)
    rank 0 → parent:  ("ready",)  ("velocities", [one per item], split report,
                                    [jobs of the forward that served each item, or None])

One message pair per denoiser forward: the group is the *predict* function of a step batcher
(workers/sampling/batcher.py) in the Celery process, so jobs of several runs share each forward,
join and leave at step boundaries, and report progress and cancellation per step exactly as on a
single-GPU worker; the Euler update and every job's state stay in the Celery process. Lock-step:
the group is idle between forwards, so a cancelled job never runs more than the step in flight.

Each forward carries its items whole (latents, timestep, captions): nothing is cached in the
ranks, so a restarted group needs no replay and a job can leave at any step. A caption is a few
hundred KB to a few MB against a step of ~0.1–1 s on a GPU. Tensors are pickled by value (plain
pickle, not shared memory: nothing outlives a message).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from workers.parallel.config import Degrees

Tensor = Any  # torch.Tensor, on CPU while in transit


@dataclass(frozen=True)
class ModelRef:
    """The transformer every rank loads for itself (each rank holds the full model)."""

    models_dir: str
    name: str  # the file in diffusion_models/
    dtype: str  # the policy's dtype name
    attention: str = "native"


@dataclass
class StepItem:
    """One job's share of a forward, all on CPU: latents [1, C, h, w] (a video's
    [1, C, F', h, w]) float32 at its current step, that step's timestep (0-d), the positive and
    (when guidance > 0) negative conditioning — caption embeds [L, D] (Z-Image, Wan) or the
    family's prompt (FLUX's, Qwen-Image's: a tuple of tensors with `.to(device)`) — and the job's
    own denoiser inputs (`extra`: FLUX's distilled `guidance`, a FLUX.1 Fill job's `fill`
    [1, 80, h, w], a Wan I2V job's `condition`
    [1, 20, F', h, w], a TI2V image-to-video job's kept start frame `keep`: samples and mask)."""

    latents: Tensor
    timestep: Tensor
    positive: Any
    negative: Any | None
    guidance: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def condition(self) -> Tensor | None:
        return self.extra.get("condition")

    @property
    def keep(self) -> tuple[Tensor, Tensor] | None:
        return self.extra.get("keep")

    def job(self) -> Any:
        """A SampleJob at this step, for the family's own predict on a rank."""
        import torch

        from workers.sampling.job import SampleJob

        return SampleJob(latents=self.latents, sigmas=torch.zeros(2),
                         timesteps=self.timestep.reshape(1), positive=self.positive,
                         negative=self.negative, guidance=self.guidance, extra=dict(self.extra))


@dataclass
class Forward:
    """One denoiser forward over `items` (any mix of sizes, captions and guidance)."""

    model: ModelRef
    degrees: Degrees
    items: list[StepItem]


def send(conn: Connection, *message: Any) -> None:
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def receive(conn: Connection) -> tuple[Any, ...]:
    message = pickle.loads(conn.recv_bytes())
    assert isinstance(message, tuple) and message, f"bad group message {message!r}"
    return message
