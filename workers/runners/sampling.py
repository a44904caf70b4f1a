"""Runners of sampling as parts (ComfyUI's custom sampling): noise, sampler, sigmas, guiders and
the custom samplers that combine them — the same parts `sample` is made of
(workers/runners/diffusion.py `sample_with`). Values: workers/models/values.py `Noise`,
`SamplerChoice`, `Sigmas`, `Guider`.

Where the farm differs from ComfyUI: a FLUX.1 guider is its distilled guidance (3.5, ComfyUI's
default without FluxGuidance), and true CFG (cfg > 1) on FLUX.1 is refused; guidance mixes as
the `sample` node's (`cond + (cfg − 1)·(cond − uncond)`, the same prediction as ComfyUI's).
"""

from __future__ import annotations

import re
from typing import Any

from workers.models.values import (
    Conditioning,
    DiffusionModel,
    Guider,
    Latent,
    Noise,
    SamplerChoice,
    Sigmas,
)
from workers.runners.base import NodeContext, NodeFailed, runner
from workers.runners.diffusion import _negative_embeds, distilled, expect, sample_with

FLUX_GUIDANCE = 3.5  # ComfyUI's FLUX.1 guidance when no FluxGuidance node sets it
_NUMBER = re.compile(r"[-+]?(?:\d*\.*\d+)")  # ManualSigmas' own pattern


@runner("sampling/noise")
def random_noise(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    return {"noise": Noise(int(inputs.get("seed", params["noise_seed"])))}


@runner("sampling/sampler")
def sampler_select(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    return {"sampler": SamplerChoice(str(params["sampler_name"]))}


@runner("sampling/scheduler")
def basic_scheduler(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    """Deferred to the sampler, which knows the latent's size (FLUX.1's shift needs it)."""
    model = expect(inputs, "model", DiffusionModel)
    denoise = float(params["denoise"])
    if denoise <= 0:
        raise NodeFailed("denoise 0 leaves no step to run")
    return {"sigmas": Sigmas(scheduler=str(params["scheduler"]), steps=int(params["steps"]),
                             denoise=denoise, model=model)}


@runner("sampling/sd-turbo-scheduler")
def sd_turbo_scheduler(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    """ComfyUI's SDTurboScheduler: the model's sigmas at timesteps 999 … 99 (every 100th),
    from 10 − ⌊10·denoise⌋ on, `steps` of them, then 0."""
    import torch

    from workers.models.families import plugin
    from workers.sampling.schedulers import DiscreteSampling

    model = expect(inputs, "model", DiffusionModel)
    sampling = plugin(model.family).model_sampling(1024, 1024)
    if not isinstance(sampling, DiscreteSampling):
        raise NodeFailed(f"{model.name} is a {model.family} flow model: SD Turbo's timesteps "
                         "are a discrete model's (SD, SDXL); use sampling/scheduler")
    start = 10 - int(10 * float(params["denoise"]))
    timesteps = torch.flip(torch.arange(1, 11) * 100 - 1, (0,))[start:start + int(params["steps"])]
    if not len(timesteps):
        raise NodeFailed("denoise 0 leaves no step to run")
    values = sampling.sigma(timesteps)
    return {"sigmas": Sigmas(values=torch.cat([values, values.new_zeros([1])]))}


@runner("sampling/manual-sigmas")
def manual_sigmas(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    import torch

    values = [float(v) for v in _NUMBER.findall(str(params["sigmas"]))]
    if not values:
        raise NodeFailed(f"no number in sigmas {params['sigmas']!r}")
    if any(v < 0 for v in values):
        raise NodeFailed("sigmas must not be negative")
    return {"sigmas": Sigmas(values=torch.FloatTensor(values))}


@runner("sampling/guider")
def basic_guider(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    return {"guider": Guider(expect(inputs, "model", DiffusionModel),
                             expect(inputs, "conditioning", Conditioning))}


@runner("sampling/cfg-guider")
def cfg_guider(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    negative = inputs.get("negative")
    if negative is not None and not isinstance(negative, Conditioning):
        raise NodeFailed(f"input 'negative' must be conditioning, got {type(negative).__name__}")
    return {"guider": Guider(expect(inputs, "model", DiffusionModel),
                             expect(inputs, "positive", Conditioning), negative,
                             float(params["cfg"]))}


@runner("sampling/custom-advanced")
def sampler_custom_advanced(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    noise = expect(inputs, "noise", Noise)
    guider = expect(inputs, "guider", Guider)
    return _custom(ctx, guider, noise.seed, inputs)


@runner("sampling/custom")
def sampler_custom(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    guider = Guider(expect(inputs, "model", DiffusionModel),
                    expect(inputs, "positive", Conditioning), inputs.get("negative"),
                    float(params["cfg"]))
    seed = int(inputs.get("seed", params["noise_seed"]))
    return _custom(ctx, guider, seed, inputs, add_noise=bool(params["add_noise"]))


def _custom(ctx: NodeContext, guider: Guider, seed: int, inputs: dict[str, Any], *,
            add_noise: bool = True) -> dict[str, Any]:
    sampler = expect(inputs, "sampler", SamplerChoice)
    sigmas = expect(inputs, "sigmas", Sigmas)
    latent = expect(inputs, "latent", Latent)
    if sigmas.model is not None and sigmas.model.family != guider.model.family:
        raise NodeFailed(f"the sigmas are {sigmas.model.name}'s ({sigmas.model.family}); the "
                         f"guider's model {guider.model.name} is {guider.model.family}")
    guidance, extra = _guidance(guider)
    extra = {**guider.positive.extra, **extra}  # a family's conditioning inputs (Wan I2V)
    negative = _negative_embeds(guider.positive, guider.negative, guidance)
    out, denoised = sample_with(ctx, guider.model, guider.positive, negative, guidance, extra,
                                latent, sigmas, sampler.name, seed, add_noise)
    return {"latent": out, "denoised": denoised}


def _guidance(guider: Guider) -> tuple[float, dict[str, Any]]:
    """(the `sample` node's guidance, the job's extra) for a guider's cfg."""
    if distilled(guider.model):
        if guider.cfg > 1.0:
            raise NodeFailed(f"{guider.model.name} is a guidance-distilled "
                             f"{guider.model.family} model: true CFG (cfg {guider.cfg}) is not "
                             "supported; use cfg 1")
        return 0.0, {"guidance": FLUX_GUIDANCE}
    return max(0.0, guider.cfg - 1.0), {}
