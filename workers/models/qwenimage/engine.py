"""Qwen-Image's math, written outside the pipeline (the diffusers pipeline is the reference).

encode prompt (Qwen2.5-VL's last hidden state under the pipeline's system template, the
template's 34 tokens dropped) → FlowMatchEuler sigmas with the resolution shift (mu) → start
latents → [transformer over packed 2×2 patches, true CFG with the pipeline's norm rescale,
per-job Euler, in the step batcher] → the 3-D VAE's decode of one frame.
On CPU in float32 every function here reproduces the matching part of `QwenImagePipeline.__call__`
(and `QwenImageImg2ImgPipeline`'s VAE encode) bit for bit (tests prove it): the template and
padding, `hidden_states[-1]`, the scheduler's own sigmas (shift_terminal, exponential shift),
the same RNG draws from a `torch.Generator("cpu")`, latents normalised by the VAE's per-channel
mean and std.

Guidance: the farm's `guidance` g is the Z-Image convention, `cond + g·(cond − uncond)` (the
importer maps ComfyUI's cfg to cfg − 1), i.e. the pipeline's `true_cfg_scale` = g + 1; its
result is rescaled to the conditional prediction's norm per token, as the pipeline does.
Batching: jobs of one latent size share a forward; prompts of other lengths are zero-padded
with an attention mask (the transformer's `encoder_hidden_states_mask`), which changes rounding
only. Not reproduced: guidance-distilled transformers (`guidance_embeds`), `max_sequence_length`
other than the pipeline's default 512.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

import torch
from PIL import Image

from workers.models import flow
from workers.models.lora import rows as lora_rows
from workers.models.qwenimage import LATENT
from workers.models.values import TextEncoder, Vae
from workers.sampling.job import SampleJob
from workers.sampling.layouts import Layout, forward_by_layout

CONFIGS = Path(__file__).parent / "configs"
TEMPLATE = ("<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, "
            "quantity, text, spatial relationships of the objects and background:<|im_end|>\n"
            "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n")
TEMPLATE_TOKENS = 34  # the pipeline's prompt_template_encode_start_idx: dropped from the states
TOKENIZER_MAX = 1024  # the pipeline's tokenizer_max_length (+ the template's tokens)
MAX_SEQUENCE_LENGTH = 512  # the pipeline's default max_sequence_length


class Tokenizers(NamedTuple):
    """A loaded Qwen2.5-VL's tokenizer (`text`) and, when its folder holds the processor's files,
    the Qwen2-VL processor that encodes prompts with images (Qwen-Image-Edit's); `folder`: where
    they were read from (named by the error when the processor is missing)."""

    text: Any
    processor: Any
    folder: Path


@torch.no_grad()
def encode_prompts(encoder: TextEncoder, texts: list[str]) -> list[torch.Tensor]:
    """Each text's embeddings [L_i, D] (padding dropped), from ONE encoder forward over the
    batch padded to its longest; one text is exactly the pipeline's call."""
    tokenizer = encoder.tokenizer
    tokenizer = tokenizer.text if isinstance(tokenizer, Tokenizers) else tokenizer
    tokens = tokenizer([TEMPLATE.format(t) for t in texts],
                               max_length=TOKENIZER_MAX + TEMPLATE_TOKENS, padding=True,
                               truncation=True, return_tensors="pt")
    device = encoder.placement.device
    ids, mask = tokens.input_ids.to(device), tokens.attention_mask.to(device)  # [B, T]
    model = encoder.model
    hidden = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[-1]
    return [hidden[i][mask[i].bool()][TEMPLATE_TOKENS:][:MAX_SEQUENCE_LENGTH].to(model.dtype)
            for i in range(len(texts))]  # each [L_i, D]


@cache
def scheduler_config() -> dict[str, Any]:
    """Qwen-Image's scheduler config (FlowMatchEuler, dynamic exponential shift, terminal 0.02)."""
    return json.loads((CONFIGS / "scheduler" / "scheduler_config.json").read_text())


def schedule(steps: int, width: int, height: int, denoise: float = 1.0,
             shift: float | None = None) -> tuple[Any, Any]:
    """(sigmas [n+1] ending in 0, timesteps [n]) float32 on CPU for one job; a fresh scheduler
    per job. n = steps − the img2img pipeline's skipped steps for strength `denoise`.

    `shift` None: the pipeline's schedule (mu from the image's tokens, stretched to end at
    shift_terminal). Else the static time shift α of ComfyUI's ModelSamplingAuraFlow:
    σ = α·t / (1 + (α − 1)·t), no terminal stretch."""
    tokens = LATENT.tokens(height // LATENT.downscale, width // LATENT.downscale)
    return flow.schedule(flow.with_shift(scheduler_config(), shift), steps, denoise,
                         lambda cfg: flow.resolution_mu(cfg, tokens))


renoise = flow.renoise


pack, unpack = flow.pack_2x2, flow.unpack_2x2


class QwenPrompt(NamedTuple):
    """An edit prompt's conditioning (the `qwenimage/edit` node's): its embeddings [L, D],
    encoded with its images by the Qwen2.5-VL, and the reference latents the transformer reads
    beside the image it denoises (each [1, 16, h, w], normalised). `timestep_zero`: whether the
    transformer reads the references at timestep 0 (Qwen-Image-Edit-2511; diffusers'
    `zero_cond_t`, ComfyUI's "index_timestep_zero"); None: as its config says. A text
    prompt's conditioning is the bare embeddings tensor."""

    embeds: torch.Tensor
    references: tuple[torch.Tensor, ...] = ()
    timestep_zero: bool | None = None

    def to(self, device: Any) -> QwenPrompt:
        return self._replace(embeds=self.embeds.to(device),
                             references=tuple(r.to(device) for r in self.references))


def embeds_of(prompt: Any) -> torch.Tensor:
    """A conditioning's embeddings [L, D] (a QwenPrompt's or a bare tensor)."""
    return prompt.embeds if isinstance(prompt, QwenPrompt) else prompt


def references_of(job: SampleJob) -> tuple[torch.Tensor, ...]:
    """The reference latents of a job (its positive prompt's; both CFG rows see them, as in the
    edit pipelines)."""
    return job.positive.references if isinstance(job.positive, QwenPrompt) else ()


def timestep_zero(transformer: Any, job: SampleJob) -> bool:
    """Whether `job`'s references are read at timestep 0: its positive prompt's choice, else the
    transformer's config (`zero_cond_t`: Qwen-Image-Edit-2511's, or ComfyUI's marker)."""
    chosen = job.positive.timestep_zero if isinstance(job.positive, QwenPrompt) else None
    return bool(transformer.config.get("zero_cond_t", False)) if chosen is None else chosen


def layout(transformer: Any, job: SampleJob) -> Layout:
    """What must match for jobs to share a forward: the latent's shape and each reference's
    (the transformer's rotary table is one set of image shapes for its whole batch), and
    whether the references are read at timestep 0 (one switch per forward)."""
    return Layout(tuple(job.latents.shape), tuple(tuple(r.shape) for r in references_of(job)),
                  timestep_zero=timestep_zero(transformer, job))


@torch.no_grad()
def predict(transformer: Any, jobs: list[SampleJob]) -> list[torch.Tensor]:
    """Each job's guided velocity [1, C, h, w]: one transformer forward per `layout` (latent
    size, reference sizes, timestep zero) over every job of it, a CFG job's conditional and
    unconditional rows side by side; jobs of other layouts run apart (their progress `batch`
    says so)."""
    return forward_by_layout(jobs, lambda job: layout(transformer, job),
                             lambda group: _forward(transformer, group))


@contextmanager
def _zero_cond_t(transformer: Any, on: bool) -> Iterator[None]:
    """The transformer (and each block) reading the references at timestep 0 or not for one
    forward: diffusers keeps `zero_cond_t` as a plain attribute of the model and its blocks (no
    weights), so one loaded transformer serves 2509 and 2511 prompts. Call from the thread that
    owns the denoiser (the step batcher's): the switch is the model's for the forward."""
    modules = [transformer, *transformer.transformer_blocks]
    before = [module.zero_cond_t for module in modules]
    for module in modules:
        module.zero_cond_t = on
    try:
        yield
    finally:
        for module, value in zip(modules, before, strict=True):
            module.zero_cond_t = value


def _forward(transformer: Any, jobs: list[SampleJob]) -> list[torch.Tensor]:
    h, w = jobs[0].latents.shape[-2:]
    refs = references_of(jobs[0])
    dtype = transformer.dtype
    rows: list[tuple[SampleJob, Any]] = []  # (job, its prompt [L, D]) per batch row
    for job in jobs:
        rows += [(job, job.positive), (job, job.negative)] if job.cfg else [(job, job.positive)]
    embeds, mask = _padded([embeds_of(prompt) for _, prompt in rows], dtype)  # [R, L, D], [R, L]
    x = torch.cat([torch.cat([pack(job.latents), *(pack(r) for r in references_of(job))], dim=1)
                   for job, _ in rows]).to(dtype)  # [R, S + refs' tokens, 4C]
    t = torch.stack([job.timesteps[job.step] for job, _ in rows]).to(dtype)  # [R]
    shapes = [(1, h // 2, w // 2), *((1, r.shape[-2] // 2, r.shape[-1] // 2) for r in refs)]
    with (lora_rows([job.loras for job, _ in rows]),  # a CFG job's two rows carry its LoRAs
          _zero_cond_t(transformer, timestep_zero(transformer, jobs[0]))):
        pred = transformer(hidden_states=x, timestep=t / 1000, encoder_hidden_states=embeds,
                           encoder_hidden_states_mask=mask, img_shapes=[shapes] * len(rows),
                           return_dict=False)[0]  # [R, S + refs' tokens, 4C]
    pred = pred[:, : (h // 2) * (w // 2)]
    velocities, row = [], 0
    for job in jobs:
        cond = pred[row : row + 1]
        if job.cfg:
            uncond = pred[row + 1 : row + 2]
            mixed = uncond + (job.guidance + 1.0) * (cond - uncond)
            cond = mixed * (torch.norm(cond, dim=-1, keepdim=True)
                            / torch.norm(mixed, dim=-1, keepdim=True))
        row += job.items
        velocities.append(unpack(cond, h, w))  # [1, C, h, w]
    return velocities


def _padded(prompts: list[torch.Tensor], dtype: torch.dtype) -> tuple[torch.Tensor, Any]:
    """Prompts [L_i, D] as one batch [R, max L, D], zero-padded, with its mask [R, max L]; the
    mask is None when every prompt has the same length (the pipeline's all-ones case)."""
    longest = max(p.shape[0] for p in prompts)
    embeds = torch.stack([torch.cat([p, p.new_zeros(longest - p.shape[0], p.shape[1])])
                          for p in prompts]).to(dtype)
    if all(p.shape[0] == longest for p in prompts):
        return embeds, None
    mask = torch.stack([torch.arange(longest, device=embeds.device) < p.shape[0] for p in prompts])
    return embeds, mask


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
    """Latents [1, 16, H/8, W/8] float32 of an RGB image: the posterior sampled with a generator
    (the img2img pipeline's draw, before its noise), else its mode; normalised per channel."""
    m = LATENT.pixel_multiple
    if image.width % m or image.height % m:
        raise ValueError(f"image sides must be multiples of {m}, got {image.width}×{image.height}")
    pixels = _image_processor().preprocess(image, height=image.height, width=image.width)
    module = vae.module
    pixels = pixels.unsqueeze(2).to(device=vae.placement.device, dtype=module.dtype)  # [1, 3, 1, H, W]
    dist = module.encode(pixels).latent_dist
    latents = dist.sample(generator) if generator is not None else dist.mode()  # [1, C, 1, h, w]
    mean, inv_std = _stats(module, latents)
    return ((latents - mean) * inv_std)[:, :, 0].float()


@torch.no_grad()
def decode_latents_batch(vae: Vae, latents: list[torch.Tensor]) -> list[Image.Image]:
    """The RGB images of same-shape latents [1, 16, h, w], from ONE VAE decode."""
    module = vae.module
    x = torch.cat(latents).unsqueeze(2).to(device=vae.placement.device, dtype=module.dtype)
    mean, inv_std = _stats(module, x)
    pixels = module.decode(x / inv_std + mean, return_dict=False)[0][:, :, 0]  # [B, 3, H, W]
    return list(_image_processor().postprocess(pixels, output_type="pil"))
