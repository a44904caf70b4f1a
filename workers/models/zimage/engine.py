"""Z-Image Turbo's math, written outside the pipeline (the diffusers pipeline is the reference).

encode prompt → sigma schedule → start latents → [transformer + Euler per step, in the step
batcher] → VAE decode. On CPU in float32 every function here reproduces the matching part of
`ZImagePipeline.__call__` / `ZImageImg2ImgPipeline.__call__` bit for bit (tests prove it):
same tokenizer chat template, 512-token padding, `hidden_states[-2]`, the scheduler's own sigmas,
the same RNG draws in the same order from a `torch.Generator("cpu")`.
Not reproduced (off in the pipelines' defaults): cfg_normalization, cfg_truncation < 1.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from workers.device.policy import Placement
from workers.models import flow
from workers.models.lora import rows as lora_rows
from workers.models.values import TextEncoder, Vae
from workers.models.zimage import LATENT
from workers.sampling.job import SampleJob

CONFIGS = Path(__file__).parent / "configs"
MAX_SEQUENCE_LENGTH = 512  # the pipeline's default caption padding
PIXELS_PER_LATENT = LATENT.downscale  # the Flux VAE downsamples ÷8
PIXEL_MULTIPLE = LATENT.pixel_multiple  # ÷8 VAE × 2×2 transformer patches
LATENT_CHANNELS = LATENT.channels


@contextmanager
def on_device(module: Any, placement: Placement) -> Iterator[Any]:
    """`module` on its placement's device for the block; back to CPU after when offloaded."""
    if not placement.offload:
        yield module
        return
    module.to(placement.device)
    try:
        yield module
    finally:
        module.to("cpu")


def encode_prompt(encoder: TextEncoder, text: str) -> torch.Tensor:
    """Caption embeddings [L, D] of `text` (the second-to-last hidden state, padding dropped)."""
    return encode_prompts(encoder, [text])[0]


@torch.no_grad()
def encode_prompts(encoder: TextEncoder, texts: list[str]) -> list[torch.Tensor]:
    """Caption embeddings [L_i, D] of each text, from ONE encoder forward over [B, 512].

    Every caption is padded to 512 tokens as in the pipeline, so an item's embeddings do not
    depend on its batch-mates beyond float rounding; one text is exactly the pipeline's call.
    """
    tok = encoder.tokenizer
    chats = [
        tok.apply_chat_template(
            [{"role": "user", "content": text}],
            tokenize=False,
            add_generation_prompt=True,
            enable_thinking=True,
        )
        for text in texts
    ]
    inputs = tok(
        chats,
        padding="max_length",
        max_length=MAX_SEQUENCE_LENGTH,
        truncation=True,
        return_tensors="pt",
    )
    with on_device(encoder.model, encoder.placement) as model:
        device = encoder.placement.device
        ids = inputs.input_ids.to(device)  # [B, 512]
        mask = inputs.attention_mask.to(device).bool()  # [B, 512]
        hidden = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        embeds = hidden.hidden_states[-2]  # [B, 512, D]
    return [embeds[i][mask[i]] for i in range(len(texts))]  # each [L_i, D]


@cache
def scheduler_config() -> dict[str, Any]:
    """Z-Image Turbo's scheduler config (FlowMatchEuler, shift 3, no dynamic shifting)."""
    return json.loads((CONFIGS / "scheduler" / "scheduler_config.json").read_text())


def sigma_schedule(
    steps: int, width: int, height: int, denoise: float = 1.0, shift: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sigmas [n+1] ending in 0, timesteps [n]) float32 on CPU for one job.

    n = steps − flow.first_step(steps, denoise). Computed by a fresh scheduler per job (the
    scheduler object is stateful; jobs keep their own sigmas). `shift` (None: the config's 3)
    is the time shift α: σ = α·t / (1 + (α − 1)·t), as ComfyUI's ModelSamplingSD3 /
    ModelSamplingAuraFlow `shift` sets it.
    """
    from diffusers.pipelines.z_image.pipeline_z_image import get_default_z_image_sigmas

    seq_len = (height // PIXEL_MULTIPLE) * (width // PIXEL_MULTIPLE)
    return flow.schedule(flow.with_shift(scheduler_config(), shift), steps, denoise,
                         lambda cfg: flow.resolution_mu(cfg, seq_len),
                         get_default_z_image_sigmas(steps))


def latent_shape(width: int, height: int) -> tuple[int, int, int, int]:
    """[1, 16, H/8, W/8] for a width×height image (sides multiples of 16)."""
    return LATENT.shape(width, height)


def noise(shape: tuple[int, ...], generator: torch.Generator, device: str) -> torch.Tensor:
    """Gaussian noise drawn from `generator` (a CPU generator: seeds are portable), float32."""
    from diffusers.utils.torch_utils import randn_tensor

    return randn_tensor(shape, generator=generator, device=torch.device(device), dtype=torch.float32)


renoise = flow.renoise


def _image_processor() -> Any:
    from diffusers.image_processor import VaeImageProcessor

    return VaeImageProcessor(vae_scale_factor=PIXELS_PER_LATENT * 2)


@torch.no_grad()
def encode_image(vae: Vae, image: Image.Image, generator: torch.Generator | None = None) -> torch.Tensor:
    """Latents [1, 16, H/8, W/8] float32 of an RGB image (sides multiples of 16).

    With a generator the VAE posterior is sampled (the img2img pipeline's draw, made before its
    noise draw); without one its mode is taken (deterministic, as ComfyUI's VAE encode).
    """
    if image.width % PIXEL_MULTIPLE or image.height % PIXEL_MULTIPLE:
        raise ValueError(f"image sides must be multiples of 16, got {image.width}×{image.height}")
    pixels = _image_processor().preprocess(image).to(dtype=torch.float32)  # [1, 3, H, W] in ±1
    with on_device(vae.module, vae.placement) as module:
        pixels = pixels.to(device=vae.placement.device, dtype=module.dtype)
        dist = module.encode(pixels).latent_dist
        latents = dist.sample(generator) if generator is not None else dist.mode()
    cfg = vae.module.config
    return ((latents - cfg.shift_factor) * cfg.scaling_factor).float()


def decode_latents(vae: Vae, latents: torch.Tensor) -> Image.Image:
    """The RGB image of latents [1, 16, H/8, W/8]."""
    return decode_latents_batch(vae, [latents])[0]


@torch.no_grad()
def decode_latents_batch(vae: Vae, latents: list[torch.Tensor]) -> list[Image.Image]:
    """The RGB images of same-shape latents [1, 16, H/8, W/8], from ONE VAE decode [B, …]."""
    with on_device(vae.module, vae.placement) as module:
        x = torch.cat(latents).to(device=vae.placement.device, dtype=module.dtype)  # [B, 16, h, w]
        x = (x / module.config.scaling_factor) + module.config.shift_factor
        pixels = module.decode(x, return_dict=False)[0]  # [B, 3, H, W] in ±1
        return list(_image_processor().postprocess(pixels, output_type="pil"))


@torch.no_grad()
def predict_velocity(transformer: Any, jobs: list[SampleJob]) -> list[torch.Tensor]:
    """One transformer forward over `jobs`; each job's guided velocity [1, C, H, W] float32.

    A CFG job contributes two items (positive, negative) as in the pipeline; jobs may differ in
    prompt length, resolution and step position (the transformer takes per-item lists).
    """
    # Read once: diffusers' `ModelMixin.dtype` walks every submodule (~2 ms on the tiny stack);
    # read per job it cost a 16-job forward a quarter of its time.
    dtype = transformer.dtype
    xs: list[torch.Tensor] = []
    ts: list[torch.Tensor] = []
    caps: list[torch.Tensor] = []
    for job in jobs:
        x = job.latents.to(dtype)[0].unsqueeze(1)  # [C, 1, H, W]
        t = (1000 - job.timesteps[job.step].expand(1)) / 1000  # [1], 1 = clean
        caption = job.positive.to(dtype)
        if job.cfg:
            assert job.negative is not None  # SampleJob checks this at creation
            xs += [x, x]
            ts += [t, t]
            caps += [caption, job.negative.to(dtype)]
        else:
            xs.append(x)
            ts.append(t)
            caps.append(caption)
    rows = [job.loras for job in jobs for _ in range(job.items)]  # a CFG job's 2 rows: its LoRAs
    with lora_rows(rows):
        outs = transformer(xs, torch.cat(ts), caps, return_dict=False)[0]  # [C, 1, H, W] each
    velocities, k = [], 0
    for job in jobs:
        pred = outs[k].float()
        if job.cfg:
            pred = pred + job.guidance * (pred - outs[k + 1].float())
        k += 2 if job.cfg else 1
        velocities.append(-pred.unsqueeze(0).squeeze(2))  # [1, C, H, W]
    return velocities
