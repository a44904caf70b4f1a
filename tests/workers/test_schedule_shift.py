"""The `shift` of a flow family's schedule is ComfyUI's: the sigmas a ComfyUI workflow samples
with after ModelSamplingSD3 / ModelSamplingAuraFlow (`shift`) or ModelSamplingFlux (`max_shift`,
`base_shift`, `width`, `height`) and the `simple` scheduler are the ones the farm's schedule
gives for the `shift` the importer sets (apps/importer/comfy_families.py `flux_shift`).

ComfyUI's side is written out here as comfy/model_sampling.py and comfy/samplers.py compute it:
a table of 1000 (DiscreteFlow) or 10000 (Flux) sigmas over t = i/N, and `simple_scheduler`
picking `steps` of them from the top. For step counts that divide the table (8, 20, 25, …) the
picked t are exactly 1 − k/steps, the families' own base sigmas: the two agree to float32
rounding (for other counts ComfyUI's table rounds t down to its grid, < 1/1000 apart).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from apps.importer.comfy_families import flux_shift
from workers.models.flux1 import engine as flux
from workers.models.zimage import engine as zimage


def time_snr_shift(alpha: float, t: torch.Tensor) -> torch.Tensor:  # model_sampling.py
    return t if alpha == 1.0 else alpha * t / (1 + (alpha - 1) * t)


def flux_time_shift(mu: float, sigma: float, t: torch.Tensor) -> torch.Tensor:
    return math.exp(mu) / (math.exp(mu) + (1 / t - 1) ** sigma)


def discrete_flow_table(shift: float, multiplier: float) -> torch.Tensor:
    """ModelSamplingDiscreteFlow.set_parameters (SD3: multiplier 1000, AuraFlow: 1.0)."""
    timesteps = (torch.arange(1, 1000 + 1, 1) / 1000) * multiplier
    return time_snr_shift(shift, timesteps / multiplier)


def flux_table(mu: float) -> torch.Tensor:
    """ModelSamplingFlux.set_parameters(shift=mu)."""
    return flux_time_shift(mu, 1.0, torch.arange(1, 10000 + 1, 1) / 10000)


def simple_scheduler(table: torch.Tensor, steps: int) -> torch.Tensor:
    """comfy/samplers.py simple_scheduler."""
    ss = len(table) / steps
    sigmas = [float(table[-(1 + int(x * ss))]) for x in range(steps)]
    return torch.FloatTensor([*sigmas, 0.0])


def comfy_flux_mu(max_shift: float, base_shift: float, width: int, height: int) -> float:
    """nodes_model_advanced.py ModelSamplingFlux.patch."""
    x1, x2 = 256, 4096
    mm = (max_shift - base_shift) / (x2 - x1)
    b = base_shift - mm * x1
    return (width * height / (8 * 8 * 2 * 2)) * mm + b


@pytest.mark.parametrize("multiplier", [1000.0, 1.0])  # ModelSamplingSD3, ModelSamplingAuraFlow
@pytest.mark.parametrize(("shift", "steps"), [(3.0, 8), (6.0, 20), (1.73, 4)])
def test_zimage_shift_is_comfyuis_discrete_flow_shift(shift, steps, multiplier):
    sigmas, timesteps = zimage.sigma_schedule(steps, 64, 64, shift=shift)
    expected = simple_scheduler(discrete_flow_table(shift, multiplier), steps)
    torch.testing.assert_close(sigmas, expected, rtol=0, atol=2e-6)
    torch.testing.assert_close(timesteps, sigmas[:-1] * 1000, rtol=0, atol=1e-3)


def test_zimage_shift_3_is_its_default_schedule_bit_for_bit():
    default, shifted = zimage.sigma_schedule(8, 64, 64), zimage.sigma_schedule(8, 64, 64, shift=3)
    assert torch.equal(default[0], shifted[0]) and torch.equal(default[1], shifted[1])


@pytest.mark.parametrize(("max_shift", "base_shift", "width", "height", "steps"),
                         [(1.15, 0.5, 1024, 1024, 4), (1.15, 0.5, 768, 1344, 20),
                          (2.0, 0.25, 512, 512, 8)])
def test_flux1_shift_is_comfyuis_model_sampling_flux(max_shift, base_shift, width, height, steps):
    alpha = flux_shift(max_shift, base_shift, width, height)
    assert alpha == pytest.approx(math.exp(comfy_flux_mu(max_shift, base_shift, width, height)))
    sigmas, _ = flux.schedule(steps, 64, 64, shift=alpha)  # the node's size, not the latent's
    mu = comfy_flux_mu(max_shift, base_shift, width, height)
    expected = simple_scheduler(flux_table(mu), steps)
    torch.testing.assert_close(sigmas, expected, rtol=0, atol=2e-6)


def test_flux1_model_sampling_sd3_shift_is_the_same_alpha():
    sigmas, _ = flux.schedule(8, 64, 64, shift=2.5)
    expected = simple_scheduler(discrete_flow_table(2.5, 1000.0), 8)
    torch.testing.assert_close(sigmas, expected, rtol=0, atol=2e-6)


def test_flux1_without_shift_keeps_the_pipelines_dynamic_shift():
    """At 1024² the pipeline's mu is 1.15 (ModelSamplingFlux's defaults): the same sigmas."""
    default, _ = flux.schedule(4, 1024, 1024)
    given, _ = flux.schedule(4, 1024, 1024, shift=flux_shift(1.15, 0.5, 1024, 1024))
    torch.testing.assert_close(default, given, rtol=0, atol=2e-6)
    assert not torch.equal(flux.schedule(4, 1024, 1024, shift=1.0)[0], default)


@pytest.mark.parametrize("engine_schedule", [zimage.sigma_schedule, flux.schedule])
def test_a_shift_keeps_the_partial_denoise_tail(engine_schedule):
    full, _ = engine_schedule(10, 64, 64, 1.0, shift=4.0)
    tail, _ = engine_schedule(10, 64, 64, 0.6, shift=4.0)
    assert torch.equal(tail, full[4:])


# --- KSampler's denoise and KSamplerAdvanced's start step, imported ---------------------------


def imported_sampler(class_type: str, **widgets: Any) -> dict[str, Any]:
    """The `sample` params the importer makes of a Z-Image workflow's sampler."""
    from apps.importer.services import comfy_import
    from tests.apps.importer.builder import CATALOG, workflow

    doc = workflow("z_image_turbo.api.json")
    sampler = doc["57:3"]
    sampler["class_type"] = class_type
    keep = ("model", "positive", "negative", "latent_image", "cfg", "sampler_name", "scheduler")
    sampler["inputs"] = {**{k: v for k, v in sampler["inputs"].items() if k in keep}, **widgets}
    result = comfy_import(workflow=doc, catalog=CATALOG)
    return result.graph.model_dump()["nodes"]["57:3"]["params"]


@pytest.mark.parametrize(("steps", "denoise"), [(4, 0.6), (8, 0.5), (20, 0.35), (14, 0.54)])
def test_ksampler_denoise_samples_comfyuis_tail_of_a_longer_schedule(steps, denoise):
    params = imported_sampler("KSampler", seed=1, steps=steps, denoise=denoise)
    ours, _ = zimage.sigma_schedule(params["steps"], 64, 64, params["denoise"], params["shift"])
    total = int(steps / denoise)  # comfy/samplers.py KSampler.set_steps
    comfy = simple_scheduler(discrete_flow_table(3.0, 1.0), total)[-(steps + 1):]
    assert len(ours) == steps + 1
    if 1000 % total == 0:
        torch.testing.assert_close(ours, comfy, rtol=0, atol=2e-6)
    else:  # ComfyUI's table rounds t down to its grid of 1/1000: σ moves ≤ shift × 1/1000
        torch.testing.assert_close(ours, comfy, rtol=0, atol=3e-3)


@pytest.mark.parametrize(("steps", "start"), [(8, 2), (25, 11), (20, 5), (41, 13)])
def test_ksampler_advanced_starts_at_comfyuis_step(steps, start):
    params = imported_sampler("KSamplerAdvanced", noise_seed=1, steps=steps, add_noise="enable",
                              start_at_step=start, end_at_step=10000,
                              return_with_leftover_noise="disable")
    from workers.runners.diffusion import _Window

    assert (params["start_step"], params["denoise"]) == (start, 1.0)  # sample/advanced's window
    own, timesteps = zimage.sigma_schedule(params["steps"], 64, 64, params["denoise"],
                                           params["shift"])
    cut = _Window.of(params).cut(own, timesteps)
    assert cut is not None
    full, _ = zimage.sigma_schedule(steps, 64, 64, 1.0, 3.0)
    assert torch.equal(cut[0], full[start:])
