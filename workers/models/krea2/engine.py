"""Krea 2's math, written outside the pipeline (the diffusers pipeline is the reference).

encode prompt (Qwen3-VL under the Qwen-Image system template, padded to a fixed 512-token block
*before* the assistant suffix, positions counting real tokens only, 12 tapped hidden states
stacked per token, the template's 34 tokens dropped) → FlowMatchEuler sigmas with the resolution
shift (mu from the image's tokens, max_image_seq_len 6400) → start latents → [transformer over
packed 2×2 patches with the text padding mask, CFG `cond + g·(cond − uncond)`, per-job Euler, in
the step batcher] → Qwen-Image's 3-D VAE decode of one frame.
On CPU in float32 every function here reproduces the matching part of `Krea2Pipeline.__call__`
bit for bit (tests prove it): the template, the fixed-length padding and its mask, the
cumulative-valid-token mRoPE positions, the taps, the scheduler's own sigmas, the same RNG draws
from a `torch.Generator("cpu")`, latents normalised by the VAE's per-channel mean and std.

Guidance: the farm's `guidance` g is the pipeline's `guidance_scale` (cond + g·(cond − uncond);
the importer maps ComfyUI's cfg c to c − 1). Batching: every prompt is the same fixed 512-token
block under its own mask, so jobs of one latent size share a forward whatever their prompts;
jobs of other sizes run in their own forward of the same step (the transformer takes one rotary
table per forward). The distilled (turbo) checkpoint's fixed mu = 1.15 is the sample node's
`shift` e^1.15 ≈ 3.158 (a static shift α is the exponential shift at mu = ln α).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

import torch
from PIL import Image

from workers.models import flow
from workers.models.krea2 import LATENT
from workers.models.lora import rows as lora_rows
from workers.models.values import TextEncoder, Vae
from workers.sampling.job import SampleJob
from workers.sampling.layouts import Layout, forward_by_layout

CONFIGS = Path(__file__).parent / "configs"
PREFIX = ("<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, "
          "quantity, text, spatial relationships of the objects and background:<|im_end|>\n"
          "<|im_start|>user\n")
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"
TEMPLATE_TOKENS = 34  # the pipeline's prompt_template_encode_start_idx: dropped from the states
SUFFIX_TOKENS = 5  # its prompt_template_encode_num_suffix_tokens
MAX_SEQUENCE_LENGTH = 512  # the pipeline's default max_sequence_length


class Krea2Prompt(NamedTuple):
    """A prompt's conditioning: the tapped hidden states [L, taps, D] of its fixed-length block
    and the block's mask [L] (bool: real tokens)."""

    embeds: torch.Tensor
    mask: torch.Tensor

    def to(self, device: Any) -> Krea2Prompt:
        return Krea2Prompt(self.embeds.to(device), self.mask.to(device))


def taps(model: Any) -> tuple[int, ...]:
    """The hidden states the transformer reads (indices into `hidden_states`, 0 the embeddings):
    every third layer from 2, the pipeline's (2, 5, …, 35) for Qwen3-VL-4B's 36 layers."""
    return tuple(range(2, int(model.config.text_config.num_hidden_layers), 3))


@torch.no_grad()
def encode_prompts(encoder: TextEncoder, texts: list[str]) -> list[Krea2Prompt]:
    """Each text's conditioning, from ONE encoder forward over the batch (every text is the same
    fixed-length block); one text is exactly the pipeline's `get_text_hidden_states`."""
    tokenizer, model = encoder.tokenizer, encoder.model
    device = encoder.placement.device
    body = tokenizer([PREFIX + t for t in texts], truncation=True, padding="max_length",
                     max_length=MAX_SEQUENCE_LENGTH + TEMPLATE_TOKENS - SUFFIX_TOKENS,
                     return_tensors="pt").to(device)
    suffix = tokenizer([SUFFIX] * len(texts), return_tensors="pt").to(device)
    ids = torch.cat([body.input_ids, suffix.input_ids], dim=1)  # [B, T]
    mask = torch.cat([body.attention_mask, suffix.attention_mask], dim=1).bool()
    positions = (mask.long().cumsum(dim=-1) - 1).clamp(min=0).unsqueeze(0).expand(3, -1, -1)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions,
                output_hidden_states=True)
    hidden = torch.stack([out.hidden_states[i] for i in taps(model)], dim=2)  # [B, T, n, D]
    hidden, mask = hidden[:, TEMPLATE_TOKENS:], mask[:, TEMPLATE_TOKENS:]
    return [Krea2Prompt(hidden[i], mask[i]) for i in range(len(texts))]


@cache
def scheduler_config() -> dict[str, Any]:
    """Krea 2's scheduler config (FlowMatchEuler, dynamic exponential shift 0.5 → 1.15 over
    256 → 6400 tokens)."""
    return dict(json.loads((CONFIGS / "scheduler" / "scheduler_config.json").read_text()))


def schedule(steps: int, width: int, height: int, denoise: float = 1.0,
             shift: float | None = None) -> tuple[Any, Any]:
    """(sigmas [n+1] ending in 0, timesteps [n]) float32 on CPU for one job; a fresh scheduler
    per job. `shift` None: the pipeline's schedule (mu from the image's tokens); else the static
    time shift α (σ = α·t / (1 + (α − 1)·t))."""
    tokens = LATENT.tokens(height // LATENT.downscale, width // LATENT.downscale)
    return flow.schedule(flow.with_shift(scheduler_config(), shift), steps, denoise,
                         lambda cfg: flow.resolution_mu(cfg, tokens))


renoise = flow.renoise
pack, unpack = flow.pack_2x2, flow.unpack_2x2


def layout(job: SampleJob) -> Layout:
    """What must match for jobs to share a forward: the latent's shape (one rotary table);
    every prompt is the same 512-token block under its mask."""
    return Layout(tuple(job.latents.shape))


@torch.no_grad()
def predict(transformer: Any, jobs: list[SampleJob]) -> list[torch.Tensor]:
    """Each job's guided velocity [1, C, h, w]: one transformer forward per latent size over
    every job of it, a CFG job's conditional and unconditional rows side by side."""
    return forward_by_layout(jobs, layout, lambda group: _forward(transformer, group))


def position_ids(text_tokens: int, h: int, w: int, device: Any) -> torch.Tensor:
    """[text + image tokens, 3]: text at the origin, image patches at (0, row, column) (the
    pipeline's prepare_position_ids) for latents [.., h, w]."""
    from diffusers.pipelines.krea2.pipeline_krea2 import Krea2Pipeline

    return Krea2Pipeline.prepare_position_ids(text_tokens, h // 2, w // 2, device)


def _forward(transformer: Any, jobs: list[SampleJob]) -> list[torch.Tensor]:
    h, w = jobs[0].latents.shape[-2:]
    dtype = transformer.dtype
    rows: list[tuple[SampleJob, Any]] = []  # (job, its Krea2Prompt) per batch row
    for job in jobs:
        rows += [(job, job.positive), (job, job.negative)] if job.cfg else [(job, job.positive)]
    embeds = torch.stack([p.embeds for _, p in rows]).to(dtype)  # [R, L, n, D]
    mask = torch.stack([p.mask for _, p in rows])  # [R, L]
    x = torch.cat([pack(job.latents) for job, _ in rows]).to(dtype)  # [R, S, 4C]
    t = (torch.stack([job.timesteps[job.step] for job, _ in rows]) / 1000).to(dtype)  # [R]
    ids = position_ids(embeds.shape[1], h, w, x.device)
    with lora_rows([job.loras for job, _ in rows]):  # a CFG job's two rows carry its LoRAs
        pred = transformer(hidden_states=x, encoder_hidden_states=embeds, timestep=t,
                           position_ids=ids, encoder_attention_mask=mask,
                           return_dict=False)[0]  # [R, S, 4C]
    velocities, row = [], 0
    for job in jobs:
        cond = pred[row : row + 1]
        if job.cfg:
            cond = cond + job.guidance * (cond - pred[row + 1 : row + 2])
        row += job.items
        velocities.append(unpack(cond, h, w))  # [1, C, h, w]
    return velocities


def _image_processor() -> Any:
    from diffusers.image_processor import VaeImageProcessor

    return VaeImageProcessor(vae_scale_factor=LATENT.pixel_multiple)


def _stats(module: Any, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The VAE's per-channel latents mean and 1/std as [1, C, 1, 1, 1] (the pipeline's)."""
    cfg = module.config
    mean = torch.tensor(cfg.latents_mean).view(1, cfg.z_dim, 1, 1, 1).to(like.device, like.dtype)
    inv_std = 1.0 / torch.tensor(cfg.latents_std).view(1, cfg.z_dim, 1, 1, 1).to(like.device,
                                                                                 like.dtype)
    return mean, inv_std


@torch.no_grad()
def encode_image(vae: Vae, image: Image.Image, generator: torch.Generator | None = None) -> torch.Tensor:
    """Latents [1, 16, H/8, W/8] float32 of an RGB image: the posterior sampled with a generator,
    else its mode; normalised per channel as the decode expects (img2img's start)."""
    m = LATENT.pixel_multiple
    if image.width % m or image.height % m:
        raise ValueError(f"image sides must be multiples of {m}, got {image.width}×{image.height}")
    pixels = _image_processor().preprocess(image, height=image.height, width=image.width)
    module = vae.module
    pixels = pixels.unsqueeze(2).to(device=vae.placement.device, dtype=module.dtype)
    dist = module.encode(pixels).latent_dist
    latents = dist.sample(generator) if generator is not None else dist.mode()  # [1, C, 1, h, w]
    mean, inv_std = _stats(module, latents)
    return ((latents - mean) * inv_std)[:, :, 0].float()


@torch.no_grad()
def decode_latents_batch(vae: Vae, latents: list[torch.Tensor]) -> list[Image.Image]:
    """The RGB images of same-shape latents [1, 16, h, w], from ONE VAE decode (the
    pipeline's: un-normalised, one frame)."""
    module = vae.module
    x = torch.cat(latents).unsqueeze(2).to(device=vae.placement.device, dtype=module.dtype)
    mean, inv_std = _stats(module, x)
    pixels = module.decode(x / inv_std + mean, return_dict=False)[0][:, :, 0]  # [B, 3, H, W]
    return list(_image_processor().postprocess(pixels, output_type="pil"))
