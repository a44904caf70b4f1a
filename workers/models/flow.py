"""Flow matching as the flow families (flux1, flux2, qwenimage, zimage) share it: a fresh
`FlowMatchEulerDiscreteScheduler` per job for its sigmas, img2img's skipped steps, the forward
process x = σ·ε + (1 − σ)·x0 and the x0 estimate x − σ·v. Each family keeps only what differs:
its scheduler config and its shift mu (resolution-dependent, or FLUX.2's empirical one). Also
the 2×2 latent packing FLUX.1 and Qwen-Image share (their pipelines' _pack_latents)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


class ScheduleError(ValueError):
    """A schedule that cannot run (no step left to run)."""


def first_step(steps: int, denoise: float) -> int:
    """Index of the first step run when only `denoise` of a `steps` schedule is re-noised: the
    img2img pipelines' `get_timesteps` rounding (denoise == their strength)."""
    start = int(max(steps - min(steps * denoise, steps), 0))
    if steps - start < 1:
        raise ScheduleError(f"denoise {denoise} of {steps} steps leaves no step to run; "
                            "raise denoise or steps")
    return start


def with_shift(config: dict[str, Any], shift: float | None) -> dict[str, Any]:
    """`config`, or with the static time shift α (σ = α·t / (1 + (α − 1)·t), ComfyUI's
    ModelSamplingSD3 / AuraFlow `shift`) in place of its dynamic shift and terminal stretch."""
    if shift is None:
        return config
    return {**config, "shift": float(shift), "use_dynamic_shifting": False, "shift_terminal": None}


def resolution_mu(config: Any, tokens: int) -> float:
    """The pipelines' `calculate_shift`: mu linear in the image's tokens between the config's
    (base_image_seq_len, base_shift) and (max_image_seq_len, max_shift)."""
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift

    return float(calculate_shift(tokens, config.get("base_image_seq_len", 256),
                                 config.get("max_image_seq_len", 4096),
                                 config.get("base_shift", 0.5), config.get("max_shift", 1.15)))


def schedule(config: dict[str, Any], steps: int, denoise: float, mu: Any,
             sigmas: Sequence[float] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(sigmas [n + 1] ending in 0, timesteps [n]) float32 on CPU of one job, from a fresh
    scheduler built from `config` (the scheduler is stateful: each job keeps its own);
    `mu(scheduler.config)` its shift; `sigmas` the pipeline's grid (default: linspace(1, 1/n)).
    n = steps − first_step(steps, denoise)."""
    import numpy as np
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler.from_config(config)
    grid = np.linspace(1.0, 1 / steps, steps) if sigmas is None else sigmas
    scheduler.set_timesteps(steps, sigmas=grid, mu=mu(scheduler.config))
    start = first_step(steps, denoise)
    return scheduler.sigmas[start:], scheduler.timesteps[start:]


def renoise(init: torch.Tensor, eps: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """x = σ·ε + (1 − σ)·x0: the flow-matching forward process (scheduler.scale_noise)."""
    sigma = sigma.to(device=init.device, dtype=init.dtype).flatten()  # [1]
    while sigma.ndim < init.ndim:
        sigma = sigma.unsqueeze(-1)
    return sigma * eps + (1.0 - sigma) * init


def to_denoised(job: Any, output: torch.Tensor) -> torch.Tensor:
    """The x0 estimate x − σ·v at the job's current evaluation (CONST sampling)."""
    return job.latents - job.sigmas[job.step] * output


def pack_2x2(latents: torch.Tensor) -> torch.Tensor:
    """[1, C, h, w] → [1, h/2 · w/2, 4C] (FLUX.1's and Qwen-Image's _pack_latents)."""
    b, c, h, w = latents.shape
    x = latents.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (h // 2) * (w // 2), c * 4)


def unpack_2x2(tokens: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """[1, h/2 · w/2, 4C] → [1, C, h, w] (their _unpack_latents, Qwen-Image's frame axis
    dropped)."""
    b, _, channels = tokens.shape
    x = tokens.view(b, h // 2, w // 2, channels // 4, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(b, channels // 4, h, w)
