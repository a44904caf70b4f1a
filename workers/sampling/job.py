"""One image's denoise, as the step batcher sees it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Tensor = Any  # torch.Tensor; this module stays importable without torch


def _no_progress(step: int, total: int) -> None:
    return None


def _never_cancelled() -> None:
    return None


@dataclass(eq=False)
class SampleJob:
    """The state of one flow-matching denoise, stepped by a `StepBatcher`.

    - `latents`: [1, C, H/8, W/8] float32 on the denoiser's device (a video family's:
      [1, C, F', H/8, W/8]); the batcher replaces it after every step (x ← x + (σ_next − σ)·v).
    - `sigmas`: [n + 1] float32, this job's own schedule ending at σ_n = 0; step i goes
      σ_i → σ_{i+1}. `timesteps`: [n] float32, the scheduler's timestep for each step.
    - `positive` / `negative`: caption embeddings [L, D] on the denoiser's device; `negative`
      is required when `guidance > 0` (classifier-free guidance is on whenever guidance > 0).
    - `extra`: the family's own per-job denoiser inputs (FLUX.1: its distilled `guidance`).
    - `advance(job, output)`: this job's own scheduler step, the next latents from the model's
      output for it (None: flow-matching Euler, `x + (σ_next − σ)·v`). The batcher batches the
      forward only; a family whose scheduler keeps state gives each job its own.
    - `step_done`: for a sampler that evaluates the model more than once per step
      (workers/sampling/samplers.py), the steps complete after each evaluation; `sigmas` /
      `timesteps` then list every evaluation and `step` counts evaluations. None: one
      evaluation per step.
    - `loras`: the model's LoRAs for this job (`DiffusionModel.loras`); the family's predict
      declares them for the job's rows (workers/models/lora.py `rows`).
    - `on_progress(done, total)` (in steps) is called by the job's own thread after each step,
      `check_cancelled()` after each evaluation; it raises (RunCancelled) to stop before the next.
    """

    latents: Tensor
    sigmas: Tensor
    timesteps: Tensor
    positive: Tensor
    negative: Tensor | None = None
    guidance: float = 0.0
    on_progress: Callable[[int, int], None] = _no_progress
    check_cancelled: Callable[[], None] = _never_cancelled
    extra: dict[str, Any] = field(default_factory=dict)
    advance: Callable[[SampleJob, Tensor], Tensor] | None = field(default=None, repr=False)
    step_done: tuple[int, ...] | None = None
    loras: tuple[Any, ...] = ()  # workers.models.lora.AppliedLora of each of this job's rows
    step: int = 0  # evaluations done so far; the batcher advances it
    batch: int = 0  # how many jobs shared the forward that made the last step
    velocity: Tensor | None = field(default=None, repr=False)  # the last step's v (previews)
    error: BaseException | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if len(self.sigmas) != len(self.timesteps) + 1:
            raise ValueError(
                f"a job needs one more sigma than timesteps, got {len(self.sigmas)} sigmas "
                f"and {len(self.timesteps)} timesteps"
            )
        if self.guidance > 0 and self.negative is None:
            raise ValueError("guidance > 0 needs negative embeddings (use the empty prompt's)")
        if self.step_done is not None and len(self.step_done) != len(self.timesteps):
            raise ValueError("step_done needs one entry per evaluation")
        if self.latents.ndim not in (4, 5) or self.latents.shape[0] != 1:
            raise ValueError(f"job latents must be [1, C, H, W] or [1, C, F, H, W], got "
                             f"{tuple(self.latents.shape)}")

    @property
    def total(self) -> int:
        return len(self.timesteps)

    @property
    def progress(self) -> tuple[int, int]:
        """(steps done, steps in all): evaluations, unless `step_done` maps them to steps."""
        if self.step_done is None:
            return self.step, self.total
        return (self.step_done[self.step - 1] if self.step else 0), self.step_done[-1]

    @property
    def items(self) -> int:
        """Items this job puts in a forward: 2 with CFG (positive and negative), else 1."""
        return 2 if self.cfg else 1

    @property
    def tokens(self) -> int:
        """Latent tokens this job puts in a forward (2×2 patches of [C, H, W], of every frame
        of [C, F, H, W], per item)."""
        frames = self.latents.shape[2] if self.latents.ndim == 5 else 1
        return self.items * frames * (self.latents.shape[-2] // 2) * (self.latents.shape[-1] // 2)

    @property
    def cfg(self) -> bool:
        return self.guidance > 0

    @property
    def done(self) -> bool:
        return self.step >= self.total
