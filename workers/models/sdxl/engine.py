"""SDXL's math, written outside the pipeline (the diffusers pipeline is the reference).

encode prompt (CLIP-L and bigG penultimate hidden states side by side, bigG's pooled
projection) → EulerDiscrete sigmas → start latents → [UNet over many jobs, CFG's two halves in
the same forward, each job's own Euler step, in the step batcher] → VAE decode.
On CPU in float32 every function here reproduces the matching part of
`StableDiffusionXLPipeline.__call__` / `StableDiffusionXLImg2ImgPipeline.__call__` bit for bit
(tests prove it): the tokenizers' padding to 77, `scheduler.init_noise_sigma`,
`scale_model_input` (the input divided by √(σ²+1)), the size conditioning (`add_time_ids`:
original size, crop (0, 0), target size), `scheduler.step` for epsilon and v-prediction, the
same RNG draws from a `torch.Generator("cpu")`.

Guidance: the farm's `guidance` g is the Z-Image convention, `cond + g·(cond − uncond)` (the
importer maps ComfyUI's cfg to cfg − 1), i.e. the pipeline's `guidance_scale` = g + 1; g = 0 is
the pipeline's scale 1 (no CFG).
Not reproduced: `guidance_rescale`, aesthetic-score conditioning (the refiner's), zero-terminal-
SNR schedules (`ztsnr` checkpoints sample on the standard schedule), `denoising_start/end`.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

import torch
from PIL import Image

from workers.models.lora import rows as lora_rows
from workers.models.sdxl import LATENT
from workers.models.values import TextEncoder, Vae
from workers.sampling.job import SampleJob

CONFIGS = Path(__file__).parent / "configs"
EPSILON, V_PREDICTION = "epsilon", "v_prediction"


class SdxlPrompt(NamedTuple):
    """One prompt's conditioning: CLIP-L ‖ bigG penultimate states [77, 768 + 1280] and bigG's
    pooled projection [1280]."""

    embeds: torch.Tensor
    pooled: torch.Tensor

    def to(self, device: Any) -> SdxlPrompt:
        return SdxlPrompt(self.embeds.to(device), self.pooled.to(device))


@torch.no_grad()
def encode_prompts(encoder: TextEncoder, texts: list[str]) -> list[SdxlPrompt]:
    """Each text's SdxlPrompt, from ONE forward of each encoder over the batch (the pipeline's
    `encode_prompt`: no attention mask, hidden_states[-2], the pooled output of the encoder whose
    first output is 2-D, i.e. bigG's projection)."""
    device = encoder.placement.device
    states, pooled = [], None
    for tokenizer, model in zip(encoder.tokenizer, encoder.model, strict=True):
        ids = tokenizer(texts, padding="max_length", max_length=tokenizer.model_max_length,
                        truncation=True, return_tensors="pt").input_ids  # [B, 77]
        out = model(ids.to(device), output_hidden_states=True)
        if pooled is None and out[0].ndim == 2:
            pooled = out[0]  # [B, P]
        states.append(out.hidden_states[-2])  # [B, 77, D_i]
    assert pooled is not None, "SDXL's second text encoder has a projection"
    embeds = torch.concat(states, dim=-1).to(dtype=encoder.model[1].dtype)  # [B, 77, 2048]
    return [SdxlPrompt(embeds[i], pooled[i]) for i in range(len(texts))]


@cache
def scheduler_config(v_pred: bool = False) -> dict[str, Any]:
    """SDXL's EulerDiscreteScheduler config (leading spacing, offset 1)."""
    config = json.loads((CONFIGS / "scheduler" / "scheduler_config.json").read_text())
    return {**config, "prediction_type": V_PREDICTION if v_pred else EPSILON}


def schedule(steps: int, width: int, height: int, denoise: float = 1.0,
             shift: float | None = None) -> tuple[Any, Any]:
    """(sigmas [n+1] ending in 0, timesteps [n]) float32 on CPU for one job: EulerDiscrete's
    own; n = steps − the img2img pipeline's skipped steps for strength `denoise`. SDXL has no
    shift: `shift` is ignored."""
    from diffusers import EulerDiscreteScheduler

    scheduler = EulerDiscreteScheduler.from_config(scheduler_config())
    scheduler.set_timesteps(steps, device="cpu")
    start = max(steps - min(int(steps * denoise), steps), 0)
    if steps - start < 1:
        raise ValueError(f"denoise {denoise} of {steps} steps leaves no step to run; "
                         "raise denoise or steps")
    return scheduler.sigmas[start:], scheduler.timesteps[start:]


def init_noise(eps: torch.Tensor, sigmas: torch.Tensor) -> torch.Tensor:
    """txt2img's start: unit noise × `scheduler.init_noise_sigma` (√(σ_max² + 1), leading
    spacing)."""
    sigma = sigmas.max().to(eps.device)
    return eps * (sigma**2 + 1) ** 0.5


def renoise(init: torch.Tensor, eps: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """x = x0 + σ·ε (scheduler.add_noise)."""
    sigma = sigma.to(device=init.device, dtype=init.dtype).flatten()
    while sigma.ndim < init.ndim:
        sigma = sigma.unsqueeze(-1)
    return init + eps * sigma


def prediction(unet: Any) -> str:
    """What `unet`'s output is: `epsilon` or `v_prediction` (set by the loader from the file)."""
    return str(getattr(unet, "prediction_type", EPSILON))


def to_denoised(job: SampleJob, output: torch.Tensor) -> torch.Tensor:
    """The x0 estimate at `job.sigmas[job.step]` (float32), as scheduler.step computes it:
    epsilon x − σ·ε; v-prediction x/(σ²+1) − v·σ/√(σ²+1)."""
    sample, sigma = job.latents.to(torch.float32), job.sigmas[job.step]
    if job.extra.get("prediction", EPSILON) == V_PREDICTION:
        return output * (-sigma / (sigma**2 + 1) ** 0.5) + (sample / (sigma**2 + 1))
    return sample - sigma * output


def advance(job: SampleJob, output: torch.Tensor) -> torch.Tensor:
    """The job's next latents: EulerDiscreteScheduler.step (no churn), in its own arithmetic."""
    sample, sigma = job.latents.to(torch.float32), job.sigmas[job.step]
    derivative = (sample - to_denoised(job, output)) / sigma
    dt = job.sigmas[job.step + 1] - sigma
    return (sample + derivative * dt).to(output.dtype)


@torch.no_grad()
def predict(unet: Any, jobs: list[SampleJob]) -> list[torch.Tensor]:
    """Each job's guided model output [1, 4, h, w]: one UNet forward per latent size over every
    job of that size, a CFG job's negative and positive side by side (the pipeline's order).
    Each job learns the model's prediction type (`extra["prediction"]`) for its step."""
    out: dict[int, torch.Tensor] = {}
    sizes: dict[tuple[int, ...], list[int]] = {}
    for index, job in enumerate(jobs):
        job.extra["prediction"] = prediction(unet)
        sizes.setdefault(tuple(job.latents.shape), []).append(index)
    for members in sizes.values():
        group = [jobs[i] for i in members]
        for i, output in zip(members, _forward(unet, group), strict=True):
            out[i] = output
    return [out[i] for i in range(len(jobs))]


def _forward(unet: Any, jobs: list[SampleJob]) -> list[torch.Tensor]:
    rows: list[tuple[SampleJob, Any]] = []  # (job, its prompt) per batch row
    for job in jobs:
        rows += [(job, job.negative), (job, job.positive)] if job.cfg else [(job, job.positive)]
    dtype = rows[0][1].embeds.dtype
    x = torch.cat([_scaled_input(job) for job, _ in rows])  # [R, 4, h, w]
    t = torch.stack([job.timesteps[job.step] for job, _ in rows])  # [R]
    h, w = (side * LATENT.downscale for side in jobs[0].latents.shape[-2:])
    time_ids = torch.tensor([[h, w, 0, 0, h, w]], dtype=dtype, device=x.device)
    added = {"text_embeds": torch.stack([prompt.pooled for _, prompt in rows]),  # [R, P]
             "time_ids": time_ids.repeat(len(rows), 1)}  # [R, 6]
    embeds = torch.stack([prompt.embeds for _, prompt in rows])  # [R, 77, D]
    with lora_rows([job.loras for job, _ in rows]):  # a CFG job's two rows carry its LoRAs
        pred = unet(x.to(unet.dtype), t, encoder_hidden_states=embeds, timestep_cond=None,
                    added_cond_kwargs=added, return_dict=False)[0]
    outputs, row = [], 0
    for job in jobs:
        if job.cfg:
            uncond, text = pred[row : row + 1], pred[row + 1 : row + 2]
            outputs.append(uncond + (job.guidance + 1.0) * (text - uncond))
            row += 2
        else:
            outputs.append(pred[row : row + 1])
            row += 1
    return outputs


def _scaled_input(job: SampleJob) -> torch.Tensor:
    """scheduler.scale_model_input: x / √(σ² + 1)."""
    sigma = job.sigmas[job.step]
    return job.latents / ((sigma**2 + 1) ** 0.5)


def _image_processor() -> Any:
    from diffusers.image_processor import VaeImageProcessor

    return VaeImageProcessor(vae_scale_factor=LATENT.pixel_multiple)


@torch.no_grad()
def encode_image(vae: Vae, image: Image.Image, generator: torch.Generator | None = None) -> torch.Tensor:
    """Latents [1, 4, H/8, W/8] float32 of an RGB image: the posterior sampled with a generator
    (the img2img pipeline's draw, before its noise), else its mode; × the scaling factor."""
    m = LATENT.pixel_multiple
    if image.width % m or image.height % m:
        raise ValueError(f"image sides must be multiples of {m}, got {image.width}×{image.height}")
    pixels = _image_processor().preprocess(image, height=image.height, width=image.width)
    module = vae.module
    dist = module.encode(pixels.to(device=vae.placement.device, dtype=module.dtype)).latent_dist
    latents = dist.sample(generator) if generator is not None else dist.mode()
    return (module.config.scaling_factor * latents).float()


@torch.no_grad()
def decode_latents_batch(vae: Vae, latents: list[torch.Tensor]) -> list[Image.Image]:
    """The RGB images of same-shape latents [1, 4, h, w], from ONE VAE decode."""
    module = vae.module
    x = torch.cat(latents).to(device=vae.placement.device, dtype=module.dtype)
    pixels = module.decode(x / module.config.scaling_factor, return_dict=False)[0]
    return list(_image_processor().postprocess(pixels, output_type="pil"))
