"""FLUX.2's math, written outside the pipeline (the diffusers pipelines are the reference).

encode prompt (Qwen3 hidden states 9, 18, 27 side by side, after the chat template) → sigmas
(FLUX.2's empirical shift from the image's tokens and the step count) → start latents →
[transformer over the 128-channel latent tokens, Klein's CFG rows or dev's embedded guidance, in
the step batcher] → batch-norm statistics undone → unpatchify 2×2 → VAE decode.
On CPU in float32 these functions reproduce `Flux2KleinPipeline.__call__` bit for bit (tests
prove it): the chat template with thinking off, the tokenizer's padding to 512, the scheduler's
own sigmas, the same RNG draw from a `torch.Generator("cpu")`, each prompt padded alike so
every job's text is 512 tokens (the pipeline gives the transformer no text mask).

Latents between nodes are ComfyUI's Flux2 latents [1, 128, H/16, W/16]: the VAE's 32 channels
patchified 2×2, normalised by the VAE's batch-norm statistics (what the pipeline's loop sees).
Not reproduced: the dev pipeline's caption upsampling, Klein's KV-cache pipeline.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

import torch
from PIL import Image

from workers.models import flow
from workers.models.flux2 import LATENT, empirical_mu
from workers.models.lora import rows as lora_rows
from workers.models.values import TextEncoder, Vae
from workers.sampling.job import SampleJob
from workers.sampling.layouts import Layout, forward_by_layout

CONFIGS = Path(__file__).parent / "configs"
MAX_SEQUENCE_LENGTH = 512  # the pipelines' text padding
KLEIN_LAYERS = (9, 18, 27)  # Flux2KleinPipeline's text_encoder_out_layers
DEV_LAYERS = (10, 20, 30)  # Flux2Pipeline's (its Mistral3's hidden states)


class Flux2Prompt(NamedTuple):
    """One prompt's conditioning: text embeddings [512, 3·D] (three hidden layers side by
    side) and the reference latents it edits from (`references`: each [1, 128, h, w], the
    `flux2/reference` node's; empty for text-to-image)."""

    embeds: torch.Tensor
    references: tuple[torch.Tensor, ...] = ()

    def to(self, device: Any) -> Flux2Prompt:
        return Flux2Prompt(self.embeds.to(device), tuple(r.to(device) for r in self.references))


@torch.no_grad()
def encode_prompts(encoder: TextEncoder, texts: list[str]) -> list[Flux2Prompt]:
    """Each text's Flux2Prompt, from ONE text-encoder forward over the batch: Klein's Qwen3
    (`Flux2KleinPipeline._get_qwen3_prompt_embeds`: the chat template without thinking, padded
    to 512, masked, hidden states 9, 18, 27) or dev's Mistral3
    (`Flux2Pipeline._get_mistral_3_small_prompt_embeds`: its system message, padded to 512,
    hidden states 10, 20, 30)."""
    model = encoder.model
    dev = model.config.model_type == "mistral3"
    tokens = _mistral_tokens if dev else _qwen3_tokens
    ids, masks = tokens(encoder.tokenizer, texts)  # [B, 512] each
    layers = DEV_LAYERS if dev else KLEIN_LAYERS
    device = encoder.placement.device
    out = model(input_ids=ids.to(device), attention_mask=masks.to(device),
                output_hidden_states=True, use_cache=False)
    states = torch.stack([out.hidden_states[k] for k in layers], dim=1)  # [B, 3, L, D]
    states = states.to(dtype=model.dtype)
    b, n, length, width = states.shape
    embeds = states.permute(0, 2, 1, 3).reshape(b, length, n * width)  # [B, 512, 3·D]
    return [Flux2Prompt(embeds[i]) for i in range(len(texts))]


def _qwen3_tokens(tokenizer: Any, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    ids, masks = [], []
    for text in texts:
        chat = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True, enable_thinking=False)
        tokens = tokenizer(chat, return_tensors="pt", padding="max_length", truncation=True,
                           max_length=MAX_SEQUENCE_LENGTH)
        ids.append(tokens["input_ids"])
        masks.append(tokens["attention_mask"])
    return torch.cat(ids), torch.cat(masks)  # [B, 512] each


def _mistral_tokens(tokenizer: Any, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """The dev pipeline's chat (its system message, each text a user turn), padded to 512."""
    from diffusers.pipelines.flux2.pipeline_flux2 import format_input
    from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE

    tokens = tokenizer.apply_chat_template(
        format_input(prompts=list(texts), system_message=SYSTEM_MESSAGE),
        add_generation_prompt=False, tokenize=True, return_dict=True, return_tensors="pt",
        padding="max_length", truncation=True, max_length=MAX_SEQUENCE_LENGTH)
    return tokens["input_ids"], tokens["attention_mask"]


@cache
def scheduler_config() -> dict[str, Any]:
    """FLUX.2's scheduler config (FlowMatchEuler, dynamic exponential shift)."""
    return json.loads((CONFIGS / "scheduler" / "scheduler_config.json").read_text())


def schedule(steps: int, width: int, height: int, denoise: float = 1.0,
             shift: float | None = None) -> tuple[Any, Any]:
    """(sigmas [n+1] ending in 0, timesteps [n]) float32 on CPU for one job; a fresh scheduler
    per job; n = steps − the skipped steps of strength `denoise` (as FLUX.1's img2img).

    `shift` None: the pipeline's empirical mu from the image's tokens and `steps` (ComfyUI's
    Flux2Scheduler). Else the time shift α itself: σ = α·t / (1 + (α − 1)·t)."""
    tokens = LATENT.tokens(height // LATENT.downscale, width // LATENT.downscale)
    return flow.schedule(flow.with_shift(scheduler_config(), shift), steps, denoise,
                         lambda cfg: empirical_mu(tokens, steps))


renoise = flow.renoise


def pack(latents: torch.Tensor) -> torch.Tensor:
    """[1, C, h, w] → [1, h·w, C] (the pipeline's _pack_latents)."""
    b, c, h, w = latents.shape
    return latents.reshape(b, c, h * w).permute(0, 2, 1)


def unpack(tokens: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """[1, h·w, C] → [1, C, h, w] (the pipeline's _unpack_latents_with_ids for raster ids)."""
    return tokens.reshape(tokens.shape[0], h, w, tokens.shape[-1]).permute(0, 3, 1, 2)


def latent_ids(h: int, w: int, t: int = 0) -> torch.Tensor:
    """[h·w, 4] positions (t, row, column, 0) of latent tokens (the pipeline's ids; references
    take t = 10, 20, …)."""
    return torch.cartesian_prod(torch.tensor([t]), torch.arange(h), torch.arange(w),
                                torch.arange(1))


def image_ids(h: int, w: int, references: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """[h·w + Σ refs' tokens, 4]: the image's positions, then each reference's at t = 10·(i + 1)
    (the pipeline's _prepare_image_ids)."""
    parts = [latent_ids(h, w)]
    parts += [latent_ids(r.shape[-2], r.shape[-1], 10 * (i + 1)) for i, r in enumerate(references)]
    return torch.cat(parts)


def layout(job: SampleJob) -> Layout:
    """What must match for jobs to share a forward: the latent's shape and each reference's
    (the transformer reads one set of positions for its whole batch)."""
    return Layout(tuple(job.latents.shape),
                  tuple(tuple(r.shape) for r in job.positive.references))


def text_ids(length: int) -> torch.Tensor:
    """[L, 4] positions (0, 0, 0, l) of text tokens."""
    zero = torch.arange(1)
    return torch.cartesian_prod(zero, zero, zero, torch.arange(length))


@torch.no_grad()
def predict(transformer: Any, jobs: list[SampleJob]) -> list[torch.Tensor]:
    """Each job's guided velocity [1, 128, h, w]: one transformer forward per `layout` (latent
    size and reference sizes) over every job of it; jobs of other layouts run apart.
    Klein: a CFG job (guidance g > 0) puts its negative and positive rows in the forward and
    mixes uncond + (g + 1)·(cond − uncond); both rows see the positive's references, as in the
    pipeline. Dev: `job.extra["guidance"]` is embedded."""
    return forward_by_layout(jobs, layout, lambda group: _forward(transformer, group))


def _forward(transformer: Any, jobs: list[SampleJob]) -> list[torch.Tensor]:
    rows: list[tuple[SampleJob, Any]] = []  # (job, its prompt) per batch row
    for job in jobs:
        rows += [(job, job.positive), (job, job.negative)] if job.cfg else [(job, job.positive)]
    h, w = jobs[0].latents.shape[-2:]
    device, dtype = jobs[0].latents.device, transformer.dtype
    refs = jobs[0].positive.references
    x = torch.cat([torch.cat([pack(job.latents), *(pack(r) for r in job.positive.references)],
                             dim=1) for job, _ in rows]).to(dtype)  # [R, h·w + refs, 128]
    t = torch.stack([job.timesteps[job.step].to(job.latents.dtype) for job, _ in rows])  # [R]
    embeds = torch.stack([prompt.embeds for _, prompt in rows])  # [R, 512, 3·D]
    guidance = None
    if transformer.config.guidance_embeds:  # dev: the distilled scale, one row per job
        guidance = torch.tensor([float(job.extra["guidance"]) for job, _ in rows],
                                device=device, dtype=torch.float32)
    with lora_rows([job.loras for job, _ in rows]):
        pred = transformer(hidden_states=x, timestep=t / 1000, guidance=guidance,
                           encoder_hidden_states=embeds,
                           txt_ids=text_ids(embeds.shape[1]).to(device),
                           img_ids=image_ids(h, w, refs).to(device), return_dict=False)[0]
    pred = pred[:, : h * w]
    outputs, row = [], 0
    for job in jobs:
        cond = pred[row : row + 1]
        if job.cfg:
            uncond = pred[row + 1 : row + 2]
            cond = uncond + (job.guidance + 1.0) * (cond - uncond)
        outputs.append(unpack(cond, h, w))
        row += job.items
    return outputs


def _statistics(module: Any, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The VAE's latent batch-norm mean and std [1, 128, 1, 1] (the pipelines' arithmetic)."""
    mean = module.bn.running_mean.view(1, -1, 1, 1).to(like.device, like.dtype)
    std = torch.sqrt(module.bn.running_var.view(1, -1, 1, 1) + module.config.batch_norm_eps)
    return mean, std.to(like.device, like.dtype)


def patchify(latents: torch.Tensor) -> torch.Tensor:
    """[B, 32, H, W] → [B, 128, H/2, W/2] (the pipeline's _patchify_latents)."""
    b, c, h, w = latents.shape
    x = latents.view(b, c, h // 2, 2, w // 2, 2).permute(0, 1, 3, 5, 2, 4)
    return x.reshape(b, c * 4, h // 2, w // 2)


def unpatchify(latents: torch.Tensor) -> torch.Tensor:
    """[B, 128, h, w] → [B, 32, 2h, 2w] (the pipeline's _unpatchify_latents)."""
    b, c, h, w = latents.shape
    x = latents.reshape(b, c // 4, 2, 2, h, w).permute(0, 1, 4, 2, 5, 3)
    return x.reshape(b, c // 4, h * 2, w * 2)


def image_processor() -> Any:
    from diffusers.pipelines.flux2.image_processor import Flux2ImageProcessor

    return Flux2ImageProcessor(vae_scale_factor=LATENT.pixel_multiple)


@torch.no_grad()
def encode_image(vae: Vae, image: Image.Image, generator: torch.Generator | None = None) -> torch.Tensor:
    """Latents [1, 128, H/16, W/16] float32 of an RGB image: the posterior's mode (FLUX.2's
    pipelines always take it), patchified and normalised."""
    m = LATENT.pixel_multiple
    if image.width % m or image.height % m:
        raise ValueError(f"image sides must be multiples of {m}, got {image.width}×{image.height}")
    pixels = image_processor().preprocess(image, height=image.height, width=image.width)
    return encode_pixels(vae, pixels)


@torch.no_grad()
def encode_reference(vae: Vae, image: Image.Image) -> torch.Tensor:
    """A reference image's latents [1, 128, h, w] float32, sized as the pipelines size it:
    scaled down to 1024² pixels of area when larger, each side floored to a multiple of 16
    and center-cropped there. A ValueError (the pipelines' own check) for sides under 64 px or
    an aspect ratio beyond 8:1."""
    processor, m = image_processor(), LATENT.pixel_multiple
    processor.check_image_input(image)
    if image.width * image.height > 1024 * 1024:
        image = processor._resize_to_target_area(image, 1024 * 1024)
    width, height = (image.width // m) * m, (image.height // m) * m
    pixels = processor.preprocess(image, height=height, width=width, resize_mode="crop")
    return encode_pixels(vae, pixels)


def encode_pixels(vae: Vae, pixels: torch.Tensor) -> torch.Tensor:
    """Latents [1, 128, h, w] float32 of preprocessed pixels [1, 3, H, W] (the pipeline's
    _encode_vae_image)."""
    module = vae.module
    dist = module.encode(pixels.to(device=vae.placement.device, dtype=module.dtype)).latent_dist
    latents = patchify(dist.mode())
    mean, std = _statistics(module, latents)
    return ((latents - mean) / std).float()


@torch.no_grad()
def decode_latents_batch(vae: Vae, latents: list[torch.Tensor]) -> list[Image.Image]:
    """The RGB images of same-shape latents [1, 128, h, w], from ONE VAE decode."""
    module = vae.module
    x = torch.cat(latents).to(vae.placement.device)
    mean, std = _statistics(module, x)
    x = unpatchify(x * std + mean).to(module.dtype)
    pixels = module.decode(x, return_dict=False)[0]
    return list(image_processor().postprocess(pixels, output_type="pil"))
