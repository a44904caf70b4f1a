"""ComfyUI's noise-mask sampling and DifferentialDiffusion's mask (workers/sampling/inpaint.py)
against ComfyUI's rule written out by hand."""

from __future__ import annotations

import torch

from workers.sampling.inpaint import NoiseMask, differential_mask
from workers.sampling.schedulers import FlowSampling

MASK = torch.tensor([[[[0.0, 0.3, 0.4995, 0.5, 0.9, 1.0]]]])


def test_the_differential_mask_is_the_mask_at_or_above_the_run_s_remaining_share():
    ms = FlowSampling(1.0)  # σ = t; sigma_min 1/1000; ComfyUI's timestep(σ) = σ
    sigmas = torch.tensor([1.0, 0.5, 0.0])
    # t_from 1, t_to sigma_min (the last sigma, 0, is below it): threshold (σ − 0.001) / 0.999
    assert differential_mask(MASK, sigmas[0], sigmas, ms).tolist() == [[[[0, 0, 0, 0, 0, 1]]]]
    # at σ 0.5: 0.499 / 0.999 = 0.4995
    assert differential_mask(MASK, sigmas[1], sigmas, ms).tolist() == [[[[0, 0, 1, 1, 1, 1]]]]


def test_a_run_ending_above_sigma_min_thresholds_down_to_its_last_sigma():
    ms = FlowSampling(1.0)
    sigmas = torch.tensor([1.0, 0.75, 0.5])  # a window: t_to 0.5, threshold (σ − 0.5) / 0.5
    assert differential_mask(MASK, torch.tensor(0.75), sigmas, ms).tolist() == \
        [[[[0, 0, 0, 1, 1, 1]]]]


def test_a_strength_below_one_blends_the_thresholded_mask_with_the_mask():
    ms, sigmas = FlowSampling(1.0), torch.tensor([1.0, 0.5, 0.0])
    blended = differential_mask(MASK, sigmas[1], sigmas, ms, strength=0.25)
    binary = torch.tensor([[[[0.0, 0, 1, 1, 1, 1]]]])
    assert torch.allclose(blended, 0.25 * binary + 0.75 * MASK)
    # ComfyUI's `if strength and strength < 1`: 0 thresholds as 1 does
    assert differential_mask(MASK, sigmas[1], sigmas, ms, strength=0.0).tolist() == \
        binary.tolist()


def test_the_model_sees_the_kept_part_noised_to_sigma_and_its_x0_is_the_kept_latent():
    ms = FlowSampling(3.0)
    latent, noise = torch.full((1, 2, 1, 6), 0.25), torch.full((1, 2, 1, 6), -1.0)
    x = torch.full((1, 2, 1, 6), 7.0)
    inpaint = NoiseMask(latent, MASK, noise, ms, torch.tensor([1.0, 0.5, 0.0]))
    m, sigma = MASK, torch.tensor(0.5)
    assert torch.equal(inpaint.model_input(x, sigma),
                       x * m + (0.5 * noise + 0.5 * latent) * (1 - m))
    assert torch.equal(inpaint.denoised(x, sigma), x * m + latent * (1 - m))
