"""What travels between the Celery process and rank 0 of a group (a local pipe, pickled bytes).

    parent → rank 0:  ("job", DenoiseJob)  then after each step ("go",) or ("stop",);  ("quit",)
    rank 0 → parent:  ("ready",)  ("step", done, latents, velocity) per step,
                      then ("done", latents, split report) or, after a stop, ("stopped",)

Lock-step: rank 0 waits for the answer to each step before the next, so a cancelled job never
runs more than the step in flight (as in the step batcher) and the group is idle when a job
ends. Tensors are pickled by value (plain pickle, not shared memory: nothing outlives a message).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
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
class DenoiseJob:
    """One SampleJob's denoise: latents [1, C, h, w] float32, sigmas [n+1], timesteps [n],
    caption embeds [L, D] (negative when guidance > 0), all on CPU."""

    model: ModelRef
    degrees: Degrees
    latents: Tensor
    sigmas: Tensor
    timesteps: Tensor
    positive: Tensor
    negative: Tensor | None
    guidance: float


def send(conn: Connection, *message: Any) -> None:
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def receive(conn: Connection) -> tuple[Any, ...]:
    message = pickle.loads(conn.recv_bytes())
    assert isinstance(message, tuple) and message, f"bad group message {message!r}"
    return message
