"""ComfyUI's noise-mask sampling (comfy/samplers.py `KSamplerX0Inpaint`) for the generic samplers,
and DifferentialDiffusion's mask function (comfy_extras/nodes_differential_diffusion.py).

At each evaluation at σ, with m the mask at σ (1: denoise, 0: keep the given latent):
  the model's input  x·m + noise_scaling(σ, ε, latent)·(1 − m)   (the given latent, noised to σ)
  its x0 estimate    x0·m + latent·(1 − m)
ε is the sampler's start noise. No blend after the last step (ComfyUI's KSampler has none): an
Euler step to σ = 0 lands on the last blended x0.

DifferentialDiffusion makes m depend on σ: with t(σ) the model sampling's timestep, t_from of the
first sigma and t_to of the last (at least sigma_min), the threshold (t(σ) − t_to) / (t_from − t_to)
falls from 1 to 0 over the run and m = [mask ≥ threshold]; a pixel of grey g is denoised from the
point its threshold drops to g, so greyer pixels are re-noised for fewer steps. A strength s < 1
blends s·m + (1 − s)·mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workers.sampling.schedulers import ModelSampling


@dataclass(frozen=True, eq=False)
class NoiseMask:
    """One job's noise mask: `latent` [1, C, …] the given samples, `mask` [1, 1, …] (1 where the
    sampler denoises), `noise` the sampler's start noise like `latent`, `sigmas` the sampler's
    sigmas; `differential` DifferentialDiffusion's strength (None: the mask as it is)."""

    latent: torch.Tensor
    mask: torch.Tensor
    noise: torch.Tensor
    ms: ModelSampling
    sigmas: torch.Tensor
    differential: float | None = None

    def at(self, sigma: torch.Tensor) -> torch.Tensor:
        """The mask of the evaluation at `sigma`."""
        if self.differential is None:
            return self.mask
        return differential_mask(self.mask, sigma, self.sigmas, self.ms, self.differential)

    def model_input(self, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        m = self.at(sigma).to(x.device, x.dtype)
        kept = self.ms.noise_scaling(sigma, self.noise.to(x.device, x.dtype),
                                     self.latent.to(x.device, x.dtype))
        return x * m + kept * (1 - m)

    def denoised(self, x0: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        m = self.at(sigma).to(x0.device, x0.dtype)
        return x0 * m + self.latent.to(x0.device, x0.dtype) * (1 - m)


def differential_mask(mask: torch.Tensor, sigma: torch.Tensor, sigmas: torch.Tensor,
                      ms: ModelSampling, strength: float = 1.0) -> torch.Tensor:
    """DifferentialDiffusion's mask at the evaluation at `sigma` of a run over `sigmas`."""
    sigma_to = torch.tensor(ms.sigma_min, dtype=sigmas.dtype)
    if sigmas[-1] > sigma_to:
        sigma_to = sigmas[-1]
    ts_from, ts_to = ms.model_timestep(sigmas[0]), ms.model_timestep(sigma_to)
    threshold = (ms.model_timestep(sigma) - ts_to) / (ts_from - ts_to)
    binary = (mask >= threshold.to(mask.device)).to(mask.dtype)
    if strength and strength < 1:
        return strength * binary + (1 - strength) * mask
    return binary
