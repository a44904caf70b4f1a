"""Wan's math, written outside the pipeline (the diffusers pipelines are the reference).

encode prompt (UMT5's last hidden state of the cleaned text, padding dropped, zero-padded to
the pipelines' 512 tokens) → FlowMatchEuler sigmas with a static shift → start latents
[1, 16, F', h, w] → [transformer over 1×2×2 patches, CFG `uncond + g·(cond − uncond)`, per-job
Euler, in the step batcher] → the 3-D VAE's decode of every frame.
Wan 2.2's two experts are two `sample` nodes (ComfyUI's KSamplerAdvanced): the high-noise
transformer runs steps [0, k), the low-noise one [k, n) of the same schedule, which is the
pipeline's switch at its boundary timestep. I2V / first-last frame (WanImageToVideoPipeline
without an image encoder, as Wan 2.2 A14B): the transformer's 36 input channels are the
latents, a 4-channel frame mask and the encoded condition video (start image, zeros, optional
last image), `condition` [1, 20, F', h, w] carried by the conditioning (ComfyUI's
concat_latent_image + concat_mask).
TI2V-5B (48 channels in and out, the Wan 2.2 VAE's latents [1, 48, F', H/16, W/16]): the
pipelines' `expand_timesteps`: the timestep is per token ([R, F'·h/2·w/2], each row its own
job's), t everywhere for text to video; image to video keeps the start image's latent frame
(a masked latent, `keep` in the job's extra: ComfyUI's Wan22ImageToVideoLatent noise_mask):
its tokens see that frame at t = 0, the rest the noisy latents at t.
On CPU in float32 these functions reproduce the pipelines' frames (tests prove it).
Not reproduced: Wan 2.1 I2V's CLIP image embeddings (`image_dim`), the UniPC scheduler of the
published diffusers configs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from PIL import Image

from workers.models.lora import rows as lora_rows
from workers.models.values import TextEncoder, Vae
from workers.models.wan import LATENT, TEMPORAL, TI2V_CHANNELS
from workers.sampling.batcher import FORWARD_JOBS
from workers.sampling.job import SampleJob

MAX_SEQUENCE_LENGTH = 512  # the pipelines' __call__ default max_sequence_length
SHIFT = 8.0  # ComfyUI's model sampling for Wan 2.1 / 2.2 (ModelSamplingSD3 shift 8)
NUM_TRAIN_TIMESTEPS = 1000


@torch.no_grad()
def encode_prompts(encoder: TextEncoder, texts: list[str]) -> list[torch.Tensor]:
    """Each text's embeddings [512, D]: its tokens' states, zeros after them (the pipeline's
    `_get_t5_prompt_embeds`), from ONE encoder forward over the batch."""
    from diffusers.pipelines.wan.pipeline_wan import prompt_clean

    tokens = encoder.tokenizer([prompt_clean(t) for t in texts], padding="max_length",
                               max_length=MAX_SEQUENCE_LENGTH, truncation=True,
                               add_special_tokens=True, return_attention_mask=True,
                               return_tensors="pt")
    device = encoder.placement.device
    ids, mask = tokens.input_ids.to(device), tokens.attention_mask.to(device)  # [B, 512]
    hidden = encoder.model(ids, mask).last_hidden_state  # [B, 512, D]
    lengths = mask.gt(0).sum(dim=1).long()
    out = []
    for row, length in zip(hidden, lengths, strict=True):
        kept = row[:length]
        out.append(torch.cat([kept, kept.new_zeros(MAX_SEQUENCE_LENGTH - kept.size(0),
                                                   kept.size(1))]))
    return out


def schedule(steps: int, width: int, height: int, denoise: float = 1.0,
             shift: float | None = None) -> tuple[Any, Any]:
    """(sigmas [n+1] ending in 0, timesteps [n]) float32 on CPU for one job: the pipeline's
    FlowMatchEulerDiscreteScheduler(shift) (σ = α·t / (1 + (α − 1)·t)), a fresh one per job;
    n = steps − the steps an img2img `denoise` skips."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler: Any = FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=NUM_TRAIN_TIMESTEPS, shift=SHIFT if shift is None else float(shift))
    scheduler.set_timesteps(steps)
    start = int(max(steps - min(steps * denoise, steps), 0))
    if steps - start < 1:
        raise ValueError(f"denoise {denoise} of {steps} steps leaves no step to run; "
                         "raise denoise or steps")
    return scheduler.sigmas[start:].float(), scheduler.timesteps[start:].float()


def renoise(init: torch.Tensor, eps: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """x = σ·ε + (1 − σ)·x0 (scheduler.scale_noise; ComfyUI's CONST noise scaling)."""
    sigma = sigma.to(device=init.device, dtype=init.dtype).flatten()
    while sigma.ndim < init.ndim:
        sigma = sigma.unsqueeze(-1)
    return sigma * eps + (1.0 - sigma) * init


@torch.no_grad()
def predict(transformer: Any, jobs: list[SampleJob]) -> list[torch.Tensor]:
    """Each job's guided velocity, shaped as its latents: one transformer forward per latent
    shape over every job of that shape (its rotary table is one video size), a CFG job's
    conditional and unconditional rows side by side."""
    out: dict[int, torch.Tensor] = {}
    sizes: dict[tuple[int, ...], list[int]] = {}
    for index, job in enumerate(jobs):
        sizes.setdefault(tuple(job.latents.shape), []).append(index)
    for members in sizes.values():
        group = [jobs[i] for i in members]
        for job in group:  # the batcher's progress `batch`: the jobs that shared the forward
            job.extra[FORWARD_JOBS] = len(group)
        for i, velocity in zip(members, _forward(transformer, group), strict=True):
            out[i] = velocity
    return [out[i] for i in range(len(jobs))]


def _video(latents: torch.Tensor) -> torch.Tensor:
    """[1, C, h, w] (a still) → [1, C, 1, h, w]; video latents pass."""
    return latents.unsqueeze(2) if latents.ndim == 4 else latents


def _forward(transformer: Any, jobs: list[SampleJob]) -> list[torch.Tensor]:
    dtype = transformer.dtype
    wants = transformer.config.in_channels
    rows: list[tuple[SampleJob, Any]] = []  # (job, its prompt [512, D]) per batch row
    for job in jobs:
        rows += [(job, job.positive), (job, job.negative)] if job.cfg else [(job, job.positive)]
    inputs = [_model_input(job, wants) for job in jobs]
    x = torch.cat([inputs[jobs.index(job)] for job, _ in rows]).to(dtype)  # [R, C_in, F', h, w]
    embeds = torch.stack([prompt for _, prompt in rows]).to(dtype)  # [R, 512, D]
    if per_token(transformer):  # TI2V-5B: [R, tokens]
        t = torch.stack([token_timesteps(job.timesteps[job.step], job.latents,
                                         job.extra.get("keep")) for job, _ in rows]).to(dtype)
    else:
        t = torch.stack([job.timesteps[job.step] for job, _ in rows]).to(dtype)  # [R]
    with lora_rows([job.loras for job, _ in rows]):
        pred = transformer(hidden_states=x, timestep=t, encoder_hidden_states=embeds,
                           return_dict=False)[0]  # [R, 16, F', h, w]
    velocities, row = [], 0
    for job in jobs:
        cond = pred[row : row + 1]
        if job.cfg:
            uncond = pred[row + 1 : row + 2]
            cond = uncond + job.guidance * (cond - uncond)
        row += job.items
        velocities.append(cond.reshape(job.latents.shape).float())
    return velocities


def per_token(transformer: Any) -> bool:
    """Whether `transformer` takes a timestep per token (TI2V-5B: the pipelines'
    `expand_timesteps`)."""
    return int(transformer.config.in_channels) == TI2V_CHANNELS


def token_timesteps(t: torch.Tensor, latents: torch.Tensor, keep: Any = None) -> torch.Tensor:
    """TI2V's timesteps [F'·h/2·w/2] at step timestep `t` (0-d) for `latents`: t, 0 on the
    tokens a masked latent keeps (`keep`: its samples and mask; the pipelines'
    `(mask[0][0][:, ::2, ::2] * t).flatten()`)."""
    if keep is None:
        mask = torch.ones(_video(latents).shape[2:], device=t.device)
    else:
        mask = _video(keep[1])[0, 0].to(t.device, torch.float32)
    return (mask[:, ::2, ::2] * t).flatten()


def kept(latents: torch.Tensor, keep: Any) -> torch.Tensor:
    """`latents` [1, C, F', h, w] with a masked latent's kept part put in (`keep`: its samples
    and mask; the pipelines' `(1 − mask)·condition + mask·latents`); as they are without."""
    x = _video(latents)
    if keep is None:
        return x
    samples, mask = (_video(v).to(x.device, x.dtype) for v in keep)
    return (1 - mask) * samples + mask * x


def _model_input(job: SampleJob, wants: int) -> torch.Tensor:
    """The transformer's input for `job`: its latents (a masked latent's kept part put in: the
    TI2V start frame), then the I2V condition (mask + encoded condition video) when the
    transformer takes one; a ValueError when they do not fit."""
    x = kept(job.latents, job.extra.get("keep"))
    condition = job.extra.get("condition")
    if condition is not None:
        x = torch.cat([x, condition.to(x.device, x.dtype)], dim=1)
    if x.shape[1] != wants:
        hint = ("wire the conditioning through wan/image-to-video" if condition is None
                else "use a text-to-video model, or drop wan/image-to-video")
        raise ValueError(f"the transformer takes {wants} input channels, the job gives "
                         f"{x.shape[1]}: {hint}")
    return x


def _stats(module: Any, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The VAE's per-channel latents mean and 1/std as [1, C, 1, 1, 1] (the pipeline's)."""
    cfg = module.config
    mean = torch.tensor(cfg.latents_mean).view(1, cfg.z_dim, 1, 1, 1).to(like.device, like.dtype)
    std = torch.tensor(cfg.latents_std).view(1, cfg.z_dim, 1, 1, 1).to(like.device, like.dtype)
    return mean, 1.0 / std


def _video_processor() -> Any:
    from diffusers.video_processor import VideoProcessor

    return VideoProcessor(vae_scale_factor=LATENT.downscale)


def to_uint8(frames: np.ndarray) -> np.ndarray:
    """Float frames in [0, 1] → uint8 (diffusers' numpy_to_pil rounding)."""
    return (frames * 255).round().astype("uint8")


@torch.no_grad()
def decode_video(vae: Vae, latents: torch.Tensor) -> np.ndarray:
    """Frames [F, H, W, 3] uint8 of video latents [1, 16, F', h, w] (the pipeline's decode and
    its `postprocess_video(output_type="np")`, rounded as diffusers rounds to 8 bits)."""
    module = vae.module
    x = _video(latents).to(device=vae.placement.device, dtype=module.dtype)
    mean, inv_std = _stats(module, x)
    video = module.decode(x / inv_std + mean, return_dict=False)[0]  # [1, 3, F, H, W]
    frames = _video_processor().postprocess_video(video.float(), output_type="np")  # [1, F, H, W, 3]
    return to_uint8(np.asarray(frames[0]))


def decode_latents_batch(vae: Vae, latents: list[torch.Tensor]) -> list[Image.Image]:
    """RGB images of same-shape latents: a still [1, 16, h, w] or a clip's first frame."""
    return [Image.fromarray(decode_video(vae, x)[0]) for x in latents]


@torch.no_grad()
def encode_video(vae: Vae, pixels: torch.Tensor) -> torch.Tensor:
    """Normalised latents [1, 16, F', h, w] float32 of pixels [1, 3, F, H, W] in [-1, 1] (the
    posterior's mode, as the I2V pipeline's `retrieve_latents(..., "argmax")`)."""
    module = vae.module
    x = pixels.to(device=vae.placement.device, dtype=module.dtype)
    latents = module.encode(x).latent_dist.mode()
    mean, inv_std = _stats(module, latents)
    return ((latents - mean) * inv_std).float()


def encode_image(vae: Vae, image: Image.Image, generator: torch.Generator | None = None) -> torch.Tensor:
    """Latents [1, 16, h, w] float32 of one RGB image (a one-frame clip)."""
    m = LATENT.pixel_multiple
    if image.width % m or image.height % m:
        raise ValueError(f"image sides must be multiples of {m}, got {image.width}×{image.height}")
    pixels = _video_processor().preprocess(image, height=image.height, width=image.width)
    return encode_video(vae, pixels.unsqueeze(2))[:, :, 0]


def i2v_condition(vae: Vae, start: Image.Image, end: Image.Image | None, width: int, height: int,
                  frames: int) -> torch.Tensor:
    """The I2V condition [1, 20, F', h, w] float32 (WanImageToVideoPipeline.prepare_latents):
    a 4-channel mask (1 on the given frames: the first, and the last in first-last mode; the
    first repeated 4× as the VAE packs it) then the encoded video of the start image, zeros
    and the end image."""
    processor = _video_processor()
    image = processor.preprocess(start, height=height, width=width).float().unsqueeze(2)
    parts = [image]
    if end is None:
        parts.append(image.new_zeros(1, 3, frames - 1, height, width))
    else:
        parts += [image.new_zeros(1, 3, frames - 2, height, width),
                  processor.preprocess(end, height=height, width=width).float().unsqueeze(2)]
    latents = encode_video(vae, torch.cat(parts, dim=2)).cpu()  # [1, 16, F', h, w]
    h, w = latents.shape[-2:]
    mask = torch.ones(1, 1, frames, h, w)
    mask[:, :, 1 : frames if end is None else frames - 1] = 0
    first = torch.repeat_interleave(mask[:, :, 0:1], dim=2, repeats=TEMPORAL)
    mask = torch.cat([first, mask[:, :, 1:]], dim=2)
    mask = mask.view(1, -1, TEMPORAL, h, w).transpose(1, 2)  # [1, 4, F', h, w]
    return torch.cat([mask, latents], dim=1)


def ti2v_start(vae: Vae, start: Image.Image, width: int, height: int) -> torch.Tensor:
    """TI2V-5B's start frame: the image resized to the clip's size, encoded alone as a one-frame
    clip by the Wan 2.2 VAE, [1, 48, 1, h, w] float32 (WanImageToVideoPipeline.prepare_latents
    with `expand_timesteps`)."""
    image = _video_processor().preprocess(start, height=height, width=width).float()
    return encode_video(vae, image.unsqueeze(2)).cpu()

