"""Qwen-Image 2.1's math, written outside the pipeline (`QwenImage21Pipeline` is the reference).

encode prompt (Qwen3-VL's last decoder layer before its final norm, under the pipeline's raw
template, the system turn's tokens dropped; with condition images: their vision slots in the
sequence and their VAE latents as references) → FlowMatchEuler over linspace(1, 1/n) with the
resolution shift mu of the image's unpatched tokens → start latents → [the block-causal
transformer over the joint text / image sequence, per-job Euler, in the step batcher] → the
RGBA VAE's decode of one frame (alpha dropped: the farm's images are RGB).
On CPU in float32 every function here reproduces the matching part of
`QwenImage21Pipeline.__call__(use_kv_cache=False)` bit for bit (tests prove it).

Guidance: the farm's g is `uncond + (g + 1)·(cond − uncond)` (the pipeline's true_cfg_scale
g + 1, no rescale); 2.1 is sampled without it (ComfyUI cfg 1 → g 0).
Batching: the transformer reads one token layout for its whole batch (its rotary table and
block-causal segments come from row 0), so rows share a forward when their prompts have the
same token count and image slots and their latents and references the same shapes — padding a
shorter prompt would move the image's rotary positions, not just the rounding. Runs of one
prompt length (the same prompt, other seeds; prompts of equal length) batch; others run apart.
Not reproduced: the pipeline's prefix KV cache (`use_kv_cache=True`, its default: the same
result within float rounding, its docstring says), `sample_sigmas` of a model's config.
"""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

import torch
from PIL import Image
from transformers import Qwen3VLProcessor
from transformers.processing_utils import ProcessorMixin

from workers.models import flow
from workers.models.lora import rows as lora_rows
from workers.models.qwenimage21 import LATENT
from workers.models.values import TextEncoder, Vae
from workers.sampling.job import SampleJob
from workers.sampling.layouts import Layout, forward_by_layout

CONFIGS = Path(__file__).parent / "configs"
SYSTEM = "Comprehend and analyze the provided prompt."
SYSTEM_TURN = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"  # dropped from the hidden states
TEMPLATE = SYSTEM_TURN + "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
VISION = "<|vision_start|><|image_pad|><|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
SLOT = 4  # latent tokens per vision slot (2×2)
OUTPUT_RESOLUTION = 1024  # the pipeline's default: condition images are resized to ~1024² px


class ImageTextProcessor(Qwen3VLProcessor):
    """Qwen3VLProcessor without its video half (its video processor needs torchvision, which
    the farm does not install); images and text are processed by Qwen3VLProcessor's methods."""

    def __init__(self, image_processor: Any = None, tokenizer: Any = None,
                 chat_template: Any = None, **kwargs: Any) -> None:
        self.image_token, self.video_token = IMAGE_PAD, "<|video_pad|>"
        self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
        self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
        self.vision_start_token, self.vision_end_token = "<|vision_start|>", "<|vision_end|>"
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)


class Tokenizers(NamedTuple):
    """A loaded Qwen3-VL's tokenizer (`text`), its processor when its folder holds the image
    processor's files (condition images need it), and that `folder` (named by errors)."""

    text: Any
    processor: Any
    folder: Path


class Prompt21(NamedTuple):
    """A prompt's conditioning: its embeddings [L, D], which of those positions are image
    slots [L] (bool: a condition image's, each slot 2×2 latent tokens), and the condition
    images' latents [1, 64, h, w] (normalised) the transformer reads in those slots."""

    embeds: torch.Tensor
    image_mask: torch.Tensor
    references: tuple[torch.Tensor, ...] = ()

    def to(self, device: Any) -> Prompt21:
        return Prompt21(self.embeds.to(device), self.image_mask.to(device),
                        tuple(r.to(device) for r in self.references))


@torch.no_grad()
def hidden_states(model: Any, inputs: Any) -> torch.Tensor:
    """The last decoder layer's output [B, T, D], before the language model's final norm (a
    forward hook hands the norm's input back, as the pipeline does)."""
    text_model = getattr(model.model, "language_model", model.model)
    handle = text_model.norm.register_forward_hook(lambda module, args, output: args[0])
    kwargs = {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"],
              "output_hidden_states": True}
    for name in ("pixel_values", "image_grid_thw", "mm_token_type_ids"):
        if inputs.get(name) is not None:
            kwargs[name] = inputs[name]
    try:
        return model(**kwargs).hidden_states[-1]
    finally:
        handle.remove()


def system_tokens(tokenizer: Any) -> int:
    return len(tokenizer(SYSTEM_TURN).input_ids)


def _prompt(model: Any, tokenizer: Any, inputs: Any) -> Prompt21:
    ids, mask = inputs["input_ids"][0], inputs["attention_mask"][0].bool()  # [T]
    hidden = hidden_states(model, inputs)[0][mask]  # [T', D]
    drop = system_tokens(tokenizer)
    image_mask = ids[mask] == tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    return Prompt21(hidden[drop:].to(model.dtype), image_mask[drop:])


@torch.no_grad()
def encode_prompts(encoder: TextEncoder, texts: list[str]) -> list[Prompt21]:
    """Each text's conditioning, one encoder forward per text (the pipeline's call for one
    prompt: left padding would move a shorter prompt's positions)."""
    tokenizers: Tokenizers = encoder.tokenizer
    device, out = encoder.placement.device, []
    for text in texts:
        inputs = tokenizers.text([TEMPLATE.format(text or " ")], padding=True,
                                 padding_side="left", return_tensors="pt").to(device)
        out.append(_prompt(encoder.model, tokenizers.text, inputs))
    return out


def dimensions(area: int, width: int, height: int) -> tuple[int, int]:
    """(width, height) of about `area` px at the image's aspect ratio, multiples of 32 (the
    pipeline's calculate_dimensions)."""
    ratio = width / height
    w = math.sqrt(area * ratio)
    return round(w / 32) * 32, round(w / ratio / 32) * 32


def condition_size(resolution: int, width: int, height: int) -> tuple[int, int]:
    """(width, height) a condition image of width × height is resized to, as ComfyUI's
    TextEncodeQwenImage21: ~resolution² px at its aspect ratio (the pipeline's
    calculate_dimensions), or, at resolution 0, its own size; sides rounded to multiples of 32,
    at least 32."""
    if resolution > 0:
        width, height = dimensions(resolution * resolution, width, height)
    else:
        width, height = round(width / 32) * 32, round(height / 32) * 32
    return max(32, width), max(32, height)


def image_processor() -> Any:
    from diffusers.image_processor import VaeImageProcessor

    return VaeImageProcessor(vae_scale_factor=LATENT.downscale,
                             vae_latent_channels=LATENT.channels)


@torch.no_grad()
def encode_with_images(encoder: TextEncoder, vae: Vae, text: str, images: list[Image.Image],
                       resolution: int = OUTPUT_RESOLUTION) -> Prompt21:
    """A prompt encoded with condition images, as the pipeline's image mode does: each image
    RGBA, resized to ~resolution² px (multiples of 32; resolution 0: its own size rounded to
    them, `condition_size`) for the Qwen3-VL (alpha flattened on white) and for the VAE (its
    mode, normalised, a reference)."""
    tokenizers: Tokenizers = encoder.tokenizer
    if tokenizers.processor is None:
        raise ValueError(f"text encoder {encoder.name} has no Qwen3-VL image processor: put its "
                         f"files (preprocessor_config.json, …) in {tokenizers.folder}/")
    processor, shown, refs = image_processor(), [], []
    for image in images:
        rgba = image.convert("RGBA")
        w, h = condition_size(resolution, *rgba.size)
        resized = processor.resize(rgba, width=w, height=h)
        white = Image.new("RGB", resized.size, (255, 255, 255))
        white.paste(resized, mask=resized.getchannel("A"))
        shown.append(white)
        refs.append(encode_pixels(vae, processor.preprocess(rgba, width=w, height=h)))
    slots = " ".join(f"<image{i + 1}>{VISION}" for i in range(len(images)))
    text = TEMPLATE.replace("<|im_start|>user\n", f"<|im_start|>user\n{slots}").format(text or " ")
    inputs = tokenizers.processor(text=[text], images=shown, padding=True, padding_side="left",
                                  return_tensors="pt").to(encoder.placement.device)
    prompt = _prompt(encoder.model, tokenizers.text, inputs)
    return prompt._replace(references=tuple(refs))


@cache
def scheduler_config() -> dict[str, Any]:
    return json.loads((CONFIGS / "scheduler" / "scheduler_config.json").read_text())


def schedule(steps: int, width: int, height: int, denoise: float = 1.0,
             shift: float | None = None) -> tuple[Any, Any]:
    """(sigmas [n+1] ending in 0, timesteps [n]): linspace(1, 1/n) shifted by mu of the
    image's (H/16)·(W/16) tokens; `shift` α: ComfyUI's static time shift instead."""
    tokens = (height // LATENT.downscale) * (width // LATENT.downscale)
    return flow.schedule(flow.with_shift(scheduler_config(), shift), steps, denoise,
                         lambda cfg: flow.resolution_mu(cfg, tokens))


renoise = flow.renoise


def pack(latents: torch.Tensor) -> torch.Tensor:
    """[B, C, h, w] → [B, h·w, C] (2.1 reads latents unpatched)."""
    return latents.flatten(2).transpose(1, 2)


def unpack(tokens: torch.Tensor, h: int, w: int) -> torch.Tensor:
    return tokens.transpose(1, 2).reshape(tokens.shape[0], tokens.shape[2], h, w)


def prompt_of(prompt: Any) -> Prompt21:
    if not isinstance(prompt, Prompt21):
        raise ValueError("a Qwen-Image 2.1 model needs conditioning encoded by its Qwen3-VL")
    return prompt


def _row_key(latents: torch.Tensor, prompt: Prompt21) -> tuple[Any, ...]:
    return (tuple(latents.shape), bytes(prompt.image_mask.cpu().numpy().tobytes()),
            *(tuple(r.shape) for r in prompt.references))


def layout(job: SampleJob) -> Layout:
    """What must match for jobs to share a forward: the latent's shape and each prompt row's
    token layout (its length, where its image slots sit, its references' shapes)."""
    prompts = [prompt_of(job.positive), *([prompt_of(job.negative)] if job.cfg else [])]
    return Layout(tuple(job.latents.shape),
                  tuple(tuple(r.shape) for prompt in prompts for r in prompt.references),
                  tuple(prompt.embeds.shape[0] for prompt in prompts),
                  tuple(tuple(prompt.image_mask.nonzero().flatten().tolist())
                        for prompt in prompts))


@torch.no_grad()
def predict(transformer: Any, jobs: list[SampleJob]) -> list[torch.Tensor]:
    """Each job's guided velocity [1, C, h, w]: one forward per `layout` over its jobs (a CFG
    job's two rows in one forward when both prompts have one layout, else two)."""
    return forward_by_layout(jobs, layout, lambda group: _forward(transformer, group))


def _forward(transformer: Any, jobs: list[SampleJob]) -> list[torch.Tensor]:
    rows: list[tuple[SampleJob, Prompt21]] = []
    for job in jobs:
        rows.append((job, prompt_of(job.positive)))
        if job.cfg:
            rows.append((job, prompt_of(job.negative)))
    groups: dict[Any, list[int]] = {}
    for index, (job, prompt) in enumerate(rows):
        groups.setdefault(_row_key(job.latents, prompt), []).append(index)
    preds: dict[int, torch.Tensor] = {}
    for members in groups.values():
        out = _rows(transformer, [rows[i] for i in members])
        for i, pred in zip(members, out, strict=True):
            preds[i] = pred
    velocities, row = [], 0
    for job in jobs:
        cond = preds[row]
        if job.cfg:
            uncond = preds[row + 1]
            cond = uncond + (job.guidance + 1.0) * (cond - uncond)
        row += 2 if job.cfg else 1
        velocities.append(cond)
    return velocities


def _rows(transformer: Any, rows: list[tuple[SampleJob, Prompt21]]) -> list[torch.Tensor]:
    """One forward over rows of one layout; each row's velocity [1, C, h, w]."""
    dtype, first = transformer.dtype, rows[0][1]
    h, w = rows[0][0].latents.shape[-2:]
    x = torch.cat([torch.cat([*(pack(r) for r in prompt.references), pack(job.latents)], dim=1)
                   for job, prompt in rows]).to(dtype)  # [R, refs' tokens + h·w, C]
    embeds = torch.stack([prompt.embeds for _, prompt in rows]).to(dtype)  # [R, L, D]
    t = torch.stack([job.timesteps[job.step] for job, _ in rows]).to(dtype)  # [R]
    shapes = [*((1, r.shape[-2], r.shape[-1]) for r in first.references), (1, h, w)]
    mask = torch.cat([first.image_mask.bool(),
                      first.image_mask.new_ones(h * w // SLOT, dtype=torch.bool)])
    mask = mask.to(x.device).expand(len(rows), -1)
    with lora_rows([job.loras for job, _ in rows]):  # a CFG job's two rows carry its LoRAs
        pred = transformer(hidden_states=x, timestep=t / 1000, encoder_hidden_states=embeds,
                           encoder_hidden_states_mask=None, img_shapes=[shapes] * len(rows),
                           img_mask=mask, return_dict=False)[0]  # [R, S, C]
    pred = pred[:, -h * w:]
    return [unpack(pred[i : i + 1], h, w) for i in range(len(rows))]


def _stats(module: Any, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    cfg = module.config
    mean = torch.tensor(cfg.latents_mean).view(1, cfg.z_dim, 1, 1, 1).to(like.device, like.dtype)
    std = torch.tensor(cfg.latents_std).view(1, cfg.z_dim, 1, 1, 1).to(like.device, like.dtype)
    return mean, std


@torch.no_grad()
def encode_pixels(vae: Vae, pixels: torch.Tensor) -> torch.Tensor:
    """Latents [1, 64, h, w] float32 of preprocessed pixels [1, 4, H, W]: the posterior's
    mode, (x − mean) / std per channel."""
    module = vae.module
    x = pixels.unsqueeze(2).to(device=vae.placement.device, dtype=module.dtype)
    latents = module.encode(x).latent_dist.mode()  # [1, C, 1, h, w]
    mean, std = _stats(module, latents)
    return ((latents - mean) / std)[:, :, 0].float()


@torch.no_grad()
def encode_image(vae: Vae, image: Image.Image, generator: torch.Generator | None = None) -> torch.Tensor:
    """Latents [1, 64, H/16, W/16] of an RGB image (opaque RGBA to the VAE), its mode."""
    m = LATENT.pixel_multiple
    if image.width % m or image.height % m:
        raise ValueError(f"image sides must be multiples of {m}, got {image.width}×{image.height}")
    rgba = image.convert("RGBA")
    return encode_pixels(vae, image_processor().preprocess(rgba, height=image.height,
                                                           width=image.width))


@torch.no_grad()
def decode_latents_batch(vae: Vae, latents: list[torch.Tensor]) -> list[Image.Image]:
    """The RGB images of same-shape latents [1, 64, h, w], from ONE VAE decode (the RGBA
    decode's alpha dropped)."""
    module = vae.module
    x = torch.cat(latents).unsqueeze(2).to(device=vae.placement.device, dtype=module.dtype)
    mean, std = _stats(module, x)
    pixels = module.decode(x * std + mean, return_dict=False)[0][:, :, 0]  # [B, 4, H, W]
    return [image.convert("RGB") for image in image_processor().postprocess(pixels, "pil")]
