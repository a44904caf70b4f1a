"""FLUX.1's math, written outside the pipeline (the diffusers pipeline is the reference).

encode prompt (CLIP-L pooled + T5 hidden states) → sigma schedule → start latents →
[transformer over packed 2×2 patches, per-job Euler, in the step batcher] → VAE decode.
On CPU in float32 every function here reproduces the matching part of `FluxPipeline.__call__` /
`FluxImg2ImgPipeline.__call__` bit for bit (tests prove it): the tokenizers' padding (CLIP to its
model_max_length, T5 to 512), the scheduler's own sigmas with FLUX's resolution-dependent shift
(mu), the guidance embedding, the same RNG draws from a `torch.Generator("cpu")`.
FLUX.1 Kontext (`FluxKontextPipeline`): a prompt's reference latents (the `flux1/reference`
node's) are packed after the image's tokens with positions of their own (first id 1) and the
transformer's output for them is dropped; `encode_reference` sizes a reference as the pipeline
does (the preferred Kontext resolution nearest its aspect).
Not reproduced: true CFG (`true_cfg_scale`), IP-adapters.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

import torch
from PIL import Image

from workers.models import flow
from workers.models.flux1 import LATENT, kontext_size
from workers.models.lora import rows as lora_rows
from workers.models.values import TextEncoder, Vae
from workers.sampling.job import SampleJob
from workers.sampling.layouts import Layout, forward_by_layout

CONFIGS = Path(__file__).parent / "configs"
MAX_SEQUENCE_LENGTH = 512  # the pipeline's T5 padding


class FluxPrompt(NamedTuple):
    """One prompt's conditioning: T5 embeddings [512, D], CLIP-L's pooled vector [P] and the
    reference latents it edits from (`references`: each [1, 16, h, w], FLUX.1 Kontext's; empty
    for text-to-image)."""

    embeds: torch.Tensor
    pooled: torch.Tensor
    references: tuple[torch.Tensor, ...] = ()

    def to(self, device: Any) -> FluxPrompt:
        return FluxPrompt(self.embeds.to(device), self.pooled.to(device),
                          tuple(r.to(device) for r in self.references))


@torch.no_grad()
def encode_prompts(encoder: TextEncoder, texts: list[str]) -> list[FluxPrompt]:
    """Each text's FluxPrompt, from ONE CLIP and ONE T5 forward over the batch (no attention
    mask: T5 sees its padding, as in the pipeline)."""
    clip, t5 = encoder.model
    clip_tok, t5_tok = encoder.tokenizer
    device = encoder.placement.device
    clip_ids = clip_tok(texts, padding="max_length", max_length=clip_tok.model_max_length,
                        truncation=True, return_overflowing_tokens=False, return_length=False,
                        return_tensors="pt").input_ids  # [B, 77]
    pooled = clip(clip_ids.to(device), output_hidden_states=False).pooler_output
    pooled = pooled.to(dtype=clip.dtype)  # [B, P]
    t5_ids = t5_tok(texts, padding="max_length", max_length=MAX_SEQUENCE_LENGTH, truncation=True,
                    return_length=False, return_overflowing_tokens=False,
                    return_tensors="pt").input_ids  # [B, 512]
    embeds = t5(t5_ids.to(device), output_hidden_states=False)[0].to(dtype=t5.dtype)  # [B, 512, D]
    return [FluxPrompt(embeds[i], pooled[i]) for i in range(len(texts))]


@cache
def scheduler_config() -> dict[str, Any]:
    """FLUX.1's scheduler config (FlowMatchEuler with dynamic shifting)."""
    return json.loads((CONFIGS / "scheduler" / "scheduler_config.json").read_text())


def schedule(steps: int, width: int, height: int, denoise: float = 1.0,
             shift: float | None = None) -> tuple[Any, Any]:
    """(sigmas [n+1] ending in 0, timesteps [n]) float32 on CPU for one job; a fresh scheduler
    per job. n = steps − the img2img pipeline's skipped steps for strength `denoise`.

    `shift` None: the pipeline's resolution-dependent shift (mu from the image's tokens). Else
    the time shift α itself: σ = α·t / (1 + (α − 1)·t), which is ComfyUI's ModelSamplingSD3
    `shift`, and its ModelSamplingFlux shift `mu` as α = e^mu (e^mu / (e^mu + 1/t − 1) is the
    same curve)."""
    tokens = LATENT.tokens(height // LATENT.downscale, width // LATENT.downscale)
    return flow.schedule(flow.with_shift(scheduler_config(), shift), steps, denoise,
                         lambda cfg: flow.resolution_mu(cfg, tokens))


renoise = flow.renoise


pack, unpack = flow.pack_2x2, flow.unpack_2x2


def image_ids(h: int, w: int, dtype: torch.dtype, device: Any, index: int = 0,
              h_offset: int = 0, w_offset: int = 0) -> torch.Tensor:
    """[h/2 · w/2, 3] positions (index, row, column) of the packed latent tokens (the
    pipeline's ids; a Kontext reference's have index 1), rows and columns shifted by the
    offsets (in latent pixels)."""
    ids = torch.zeros(h // 2, w // 2, 3)
    ids[..., 0] = index
    ids[..., 1] = ids[..., 1] + torch.arange(h // 2)[:, None] + h_offset // 2
    ids[..., 2] = ids[..., 2] + torch.arange(w // 2)[None, :] + w_offset // 2
    return ids.reshape(-1, 3).to(device=device, dtype=dtype)


def reference_ids(references: tuple[torch.Tensor, ...], dtype: torch.dtype, device: Any
                  ) -> list[torch.Tensor]:
    """Each reference's positions, all at index 1: the first at the origin (FluxKontextPipeline's
    one image), each further one beside or below those before it, where the canvas grows least
    (ComfyUI's Kontext "offset" method)."""
    ids, height, width = [], 0, 0
    for ref in references:
        h, w = ref.shape[-2], ref.shape[-1]
        h_offset = w_offset = 0
        if h + height > w + width:
            w_offset = width
        else:
            h_offset = height
        height, width = max(height, h + h_offset), max(width, w + w_offset)
        ids.append(image_ids(h, w, dtype, device, 1, h_offset, w_offset))
    return ids


def layout(job: SampleJob) -> Layout:
    """What must match for jobs to share a forward: the latent's shape and each reference's
    (the transformer reads one set of positions for its whole batch)."""
    return Layout(tuple(job.latents.shape), tuple(tuple(r.shape) for r in job.positive.references))


@torch.no_grad()
def predict(transformer: Any, jobs: list[SampleJob]) -> list[torch.Tensor]:
    """Each job's velocity [1, C, h, w]: one transformer forward per `layout` (latent size and
    reference sizes) over every job of it (FLUX's transformer takes a [B, S, 64] batch; sizes
    do not mix). A job's distilled guidance is `job.extra["guidance"]`; its prompt's references
    follow its image tokens (Kontext). Jobs of other layouts run apart (their progress `batch`
    says so: workers/sampling/layouts.py)."""
    return forward_by_layout(jobs, layout, lambda group: _forward(transformer, group))


def _forward(transformer: Any, jobs: list[SampleJob]) -> list[torch.Tensor]:
    h, w = jobs[0].latents.shape[-2:]
    dtype, device = transformer.dtype, jobs[0].latents.device
    refs = jobs[0].positive.references
    x = torch.cat([torch.cat([pack(_with_fill(transformer, job)),
                              *(pack(r) for r in job.positive.references)], dim=1)
                   for job in jobs]).to(dtype)  # [B, S + refs' tokens, 4C (Fill: 4C + masks)]
    t = torch.cat([job.timesteps[job.step].expand(1) for job in jobs]).to(dtype)  # [B]
    guidance = None
    if transformer.config.guidance_embeds:
        guidance = torch.cat([torch.full([1], float(job.extra["guidance"]),
                                         device=device, dtype=torch.float32) for job in jobs])
    embeds = torch.stack([job.positive.embeds for job in jobs])  # [B, 512, D]
    pooled = torch.stack([job.positive.pooled for job in jobs])  # [B, P]
    txt_ids = torch.zeros(embeds.shape[1], 3).to(device=device, dtype=embeds.dtype)
    img_ids = torch.cat([image_ids(h, w, x.dtype, device), *reference_ids(refs, x.dtype, device)])
    with lora_rows([job.loras for job in jobs]):  # one row per job (no CFG)
        pred = transformer(hidden_states=x, timestep=t / 1000, guidance=guidance,
                           pooled_projections=pooled, encoder_hidden_states=embeds,
                           txt_ids=txt_ids, img_ids=img_ids, return_dict=False)[0]
    pred = pred[:, : (h // 2) * (w // 2)]  # the references' outputs are dropped
    return [unpack(pred[i : i + 1], h, w) for i in range(len(jobs))]  # each [1, C, h, w]


VAE_SCALE, VAE_SHIFT = 0.3611, 0.1159  # FLUX's ae (ComfyUI's latent_formats.Flux)


def is_fill(transformer: Any) -> bool:
    """FLUX.1 Fill: its transformer reads the latents (16 channels) beside the masked image's
    latents (16) and the mask (64: each latent pixel's 8×8 mask pixels), 96 · 2×2 = 384 wide."""
    return int(transformer.config.in_channels) > 4 * LATENT.channels


def _with_fill(transformer: Any, job: SampleJob) -> torch.Tensor:
    """The job's latents [1, 16, h, w], with a Fill transformer's condition [1, 80, h, w] beside
    them (the job's `fill`, else ComfyUI's default: a zero image, all masked)."""
    if not is_fill(transformer):
        return job.latents
    fill = job.extra.get("fill")
    if fill is None:
        fill = _no_fill(job.latents, transformer.config)
    return torch.cat([job.latents, fill.to(job.latents.device, job.latents.dtype)], dim=1)


def _no_fill(latents: torch.Tensor, config: Any) -> torch.Tensor:
    """ComfyUI's Flux.concat_cond without an image: zero latents brought into the model's
    space (as its process_latent_in does) and a mask of ones."""
    b, _, h, w = latents.shape
    image = (torch.zeros(b, LATENT.channels, h, w) - VAE_SHIFT) * VAE_SCALE
    mask = torch.ones(b, LATENT.downscale**2, h, w)
    return torch.cat([image, mask], dim=1).to(latents.device)


@torch.no_grad()
def fill_condition(vae: Vae, image: Image.Image, mask: torch.Tensor,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """A Fill transformer's condition [1, 80, H/8, W/8]: the latents of `image` with the masked
    part (the mask rounded, as ComfyUI's InpaintModelConditioning greys it) grey (the posterior
    sampled with a generator as FluxFillPipeline's draw, else its mode), then `mask` [H, W]
    (1: repaint) as 64 channels, each latent pixel's 8×8 mask pixels
    (FluxFillPipeline.prepare_mask_latents / ComfyUI's Flux.concat_cond). A binary mask is
    FluxFillPipeline's condition exactly."""
    d = LATENT.downscale
    if tuple(mask.shape) != (image.height, image.width):
        raise ValueError(f"the mask is {mask.shape[-1]}×{mask.shape[-2]}; the image "
                         f"{image.width}×{image.height}")
    pixels = _image_processor().preprocess(image, height=image.height, width=image.width)
    masked = pixels * (1 - mask.float().round()[None, None])  # [-1, 1]: 0 is grey
    latents = _encode_pixels(vae, masked, generator)  # [1, 16, h, w]
    h, w = image.height // d, image.width // d
    cells = mask.float().view(1, h, d, w, d).permute(0, 2, 4, 1, 3).reshape(1, d * d, h, w)
    return torch.cat([latents, cells.to(latents.device)], dim=1)


def _image_processor() -> Any:
    from diffusers.image_processor import VaeImageProcessor

    return VaeImageProcessor(vae_scale_factor=LATENT.pixel_multiple)


@torch.no_grad()
def encode_image(vae: Vae, image: Image.Image, generator: torch.Generator | None = None) -> torch.Tensor:
    """Latents [1, 16, H/8, W/8] float32 of an RGB image; the posterior sampled with a generator
    (the img2img pipeline's draw, before its noise), else its mode."""
    m = LATENT.pixel_multiple
    if image.width % m or image.height % m:
        raise ValueError(f"image sides must be multiples of {m}, got {image.width}×{image.height}")
    pixels = _image_processor().preprocess(image, height=image.height, width=image.width)
    return _encode_pixels(vae, pixels, generator)


def _encode_pixels(vae: Vae, pixels: torch.Tensor,
                   generator: torch.Generator | None) -> torch.Tensor:
    """Latents [1, 16, H/8, W/8] float32 of pixels [1, 3, H, W] in [-1, 1]."""
    pixels = pixels.to(dtype=torch.float32)
    module = vae.module
    dist = module.encode(pixels.to(device=vae.placement.device, dtype=module.dtype)).latent_dist
    latents = dist.sample(generator) if generator is not None else dist.mode()
    return ((latents - module.config.shift_factor) * module.config.scaling_factor).float()


@torch.no_grad()
def encode_reference(vae: Vae, image: Image.Image) -> torch.Tensor:
    """A Kontext reference image's latents [1, 16, h, w] float32, sized as FluxKontextPipeline
    sizes it: stretched (Lanczos) to the preferred Kontext resolution nearest its aspect, then
    encoded (the posterior's mode)."""
    width, height = kontext_size(image.width, image.height)
    resized = _image_processor().resize(image, height, width)
    return encode_image(vae, resized)


@torch.no_grad()
def decode_latents_batch(vae: Vae, latents: list[torch.Tensor]) -> list[Image.Image]:
    """The RGB images of same-shape latents [1, 16, h, w], from ONE VAE decode."""
    module = vae.module
    x = torch.cat(latents).to(device=vae.placement.device, dtype=module.dtype)
    x = (x / module.config.scaling_factor) + module.config.shift_factor
    pixels = module.decode(x, return_dict=False)[0]
    return list(_image_processor().postprocess(pixels, output_type="pil"))
