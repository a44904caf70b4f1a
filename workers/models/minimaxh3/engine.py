"""MiniMax-H3 video + audio through diffusers 0.42's own modules, reproducing
`MiniMaxH3ModularPipeline`'s t2va and fl2va workflows step for step on CPU: the Qwen3-VL hidden
state after layer 50 of the prompt (after a `<Picture i>: ` label and vision block per keyframe),
the keyframes VAE-encoded as conditioning rows held at t = 0.999, the packed
`[text | keyframes | audio | video]` sequence with its rotary grid, the
two MiniMax-H3 schedules (video shift 12, audio shift 3) stepped inside one transformer call per
step, and the video VAE decode to frames in [0, 1] plus the audio VAE decode to a stereo waveform.

The checkpoint is guidance-distilled: one forward per step, no negative prompt. As in the
pipeline, `steps` counts the sigma grid's points, so a render runs `steps − 1` forwards.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image

MIN_SECONDS, MAX_SECONDS = 5.0, 15.0  # MiniMaxH3ModularPipeline.min_duration / max_duration
VIDEO_SHIFT, AUDIO_SHIFT = 12.0, 3.0
KEYFRAME_T = 0.999  # keyframe_noise_aug: the t its conditioning rows are held at
KEYFRAME_SEED = 42  # keyframe_encode_seed: the VAE posterior of a keyframe is sampled under it
MAX_REFERENCES = 9  # MiniMaxH3Ref2VASetupStep.max_images
REFERENCE_SHORT_EDGE = 2048  # reference_image_short_edge: a reference's size in ComfyUI's "max"
REFERENCE_SIZES = ("match", "max")  # ComfyUI's ref_image_size
PIXEL_MEAN, PIXEL_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # ImageNet's


@dataclass
class Parts:
    """The modules of one MiniMax-H3 stack (diffusers' component names)."""

    transformer: Any
    vae: Any
    audio_vae: Any
    text_encoder: Any
    tokenizer: Any
    processor: Any
    # a checkpoint folder beside a `transformer_ref/`: its transformer is the first/last-frame
    # partition, not reference-to-video's
    keyframe_partition: bool = False


@dataclass(frozen=True)
class Geometry:
    """A request's sizes: the canvas, its 17n + 5 frames and the latent grid they pack into."""

    width: int
    height: int
    frames: int
    latent_frames: int
    latent_height: int
    latent_width: int
    audio_latents: int


@dataclass
class Clip:
    """A rendered clip: frames [F, 3, H, W] float32 in [0, 1], a stereo waveform [2, samples]
    float32 at `sample_rate`."""

    frames: torch.Tensor
    audio: torch.Tensor
    sample_rate: int
    fps: int = 24


def geometry(parts: Parts, width: int, height: int, frames: int) -> Geometry:
    """The request's sizes; a ValueError naming the problem for a canvas off MiniMax-H3's grid
    or a clip outside 5 to 15 seconds once its frames are rounded up to 17n + 5."""
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import (
        MINIMAX_H3_FPS,
        align_num_frames,
        audio_latent_num_frames,
        video_latent_num_frames,
    )

    ratio = parts.vae.spatial_compression_ratio
    multiple = ratio * parts.transformer.config.patch_size[2]
    if width <= 0 or height <= 0 or width % multiple or height % multiple:
        raise ValueError(f"width and height must be positive multiples of {multiple}, "
                         f"got {width}×{height}")
    per_chunk, latents_per_chunk = parts.vae.config.clip_length, parts.vae.tokens_chunk_size
    aligned = align_num_frames(frames, per_chunk, latents_per_chunk)
    if not MIN_SECONDS <= aligned / MINIMAX_H3_FPS <= MAX_SECONDS:
        raise ValueError(
            f"MiniMax-H3 makes {MIN_SECONDS:g} to {MAX_SECONDS:g} s clips at {MINIMAX_H3_FPS} fps: "
            f"length {frames} (rounded up to {aligned}, {per_chunk}n + {latents_per_chunk}) is "
            f"outside {int(MIN_SECONDS * MINIMAX_H3_FPS)}..{int(MAX_SECONDS * MINIMAX_H3_FPS)}")
    return Geometry(width, height, aligned,
                    video_latent_num_frames(aligned, per_chunk, latents_per_chunk),
                    height // ratio, width // ratio, audio_latent_num_frames(aligned))


@torch.no_grad()
def encode_prompt(parts: Parts, prompt: str,
                  keyframes: Sequence[Image.Image] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """The conditioning [1, L, D] (Qwen3-VL's hidden state after layer 50) of the prompt verbatim
    without special tokens, preceded per keyframe by a `<Picture i>: ` label and its vision block,
    and its rows' modality tags [L] (a vision block's rows are video rows)."""
    from diffusers.modular_pipelines.minimax_h3.encoders import get_qwen3vl_prompt_embeds
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import (
        MINIMAX_H3_TEXT_TAG,
        MINIMAX_H3_VIDEO_TAG,
    )

    tokenizer, processor = parts.tokenizer, parts.processor
    vision: dict[str, Any] = {}
    token_ids: list[int] = []
    tags: list[int] = []
    if keyframes:
        images = processor.image_processor(images=list(keyframes), return_tensors="pt")
        vision = {"pixel_values": images["pixel_values"], "image_grid_thw": images["image_grid_thw"]}
        merge = processor.image_processor.merge_size**2
        for index, grid in enumerate(images["image_grid_thw"]):
            label = tokenizer(f"<Picture {index + 1}>: ", add_special_tokens=False)["input_ids"]
            block = ([tokenizer.convert_tokens_to_ids("<|vision_start|>")]
                     + [tokenizer.convert_tokens_to_ids("<|image_pad|>")] * (int(grid.prod()) // merge)
                     + [tokenizer.convert_tokens_to_ids("<|vision_end|>")])
            token_ids += label + block
            tags += [MINIMAX_H3_TEXT_TAG] * len(label) + [MINIMAX_H3_VIDEO_TAG] * len(block)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    token_ids += prompt_ids
    tags += [MINIMAX_H3_TEXT_TAG] * len(prompt_ids)
    embeds = get_qwen3vl_prompt_embeds(parts.text_encoder, processor, token_ids, vision,
                                       text_encoder_layer=50, device=parts.transformer.device,
                                       dtype=parts.text_encoder.dtype)
    return embeds, torch.tensor(tags, dtype=torch.long)


def fit_keyframes(first: Image.Image | None, last: Image.Image | None, width: int,
                  height: int) -> tuple[list[Image.Image], tuple[str, ...]]:
    """The keyframes on the canvas and the end each anchors ("first", "last"): the first one
    given is stretched onto it (Lanczos), a last one after a first is cover-cropped (the
    pipeline's ResizeStep arithmetic)."""
    keyframes: list[Image.Image] = []
    anchors: list[str] = []
    for anchor, image in (("first", first), ("last", last)):
        if image is None:
            continue
        image = image.convert("RGB")
        if image.size == (width, height):
            keyframes.append(image)
        elif not keyframes:
            keyframes.append(image.resize((width, height), Image.Resampling.LANCZOS))
        else:
            scale = max(width / image.size[0], height / image.size[1])
            size = (max(width, round(image.size[0] * scale)), max(height, round(image.size[1] * scale)))
            left, top = max(0, (size[0] - width) // 2), max(0, (size[1] - height) // 2)
            keyframes.append(image.resize(size, Image.Resampling.LANCZOS)
                             .crop((left, top, left + width, top + height)))
        anchors.append(anchor)
    return keyframes, tuple(anchors)


def encode_keyframe(parts: Parts, image: Image.Image) -> torch.Tensor:
    """A keyframe's normalised conditioning latents [1, C, 1, h, w] (the posterior sampled under
    seed 42 and rounded to float16, the released recipe)."""
    from diffusers.modular_pipelines.minimax_h3.encoders import encode_vae_condition

    pixels = torch.from_numpy(np.array(image)).permute(2, 0, 1)[None, :, None].to(parts.vae.device)
    return encode_vae_condition(parts.vae, pixels, PIXEL_MEAN, PIXEL_STD, KEYFRAME_SEED)


@dataclass
class H3Run:
    """One run's denoising state: the packed video rows [N, C·4] (the `held` keyframe rows
    first) and channel-major audio rows [2·L, C], its prompt's embeds and the packed layout
    (the transformer's row arguments), its two schedules and the step it is at."""

    size: Geometry
    video: torch.Tensor
    audio: torch.Tensor
    embeds: torch.Tensor
    layout: dict[str, torch.Tensor]
    held: int
    video_schedule: Any
    audio_schedule: Any
    step: int = 0

    @property
    def steps(self) -> int:
        """The run's transformer forwards (the sigma grid's points − 1)."""
        return len(self.video_schedule.timesteps)

    @property
    def done(self) -> bool:
        return self.step >= self.steps


@dataclass(frozen=True, eq=False)
class Request:
    """What a run starts from: its sizes, its prompt's conditioning [1, L, D] with the rows'
    modality tags [L], and its keyframes' conditioning latents [1, C, 1, h, w] with the end each
    anchors ("first", "last")."""

    size: Geometry
    embeds: torch.Tensor
    tags: torch.Tensor
    conditions: tuple[torch.Tensor, ...] = ()
    anchors: tuple[str, ...] = ()
    references: bool = False  # ref2va: the conditions are image references, not keyframes


@torch.no_grad()
def prepare(parts: Parts, prompt: str, *, width: int, height: int, frames: int,
            first: Image.Image | None = None, last: Image.Image | None = None) -> Request:
    """The request of a clip: its sizes (geometry), the prompt encoded with its keyframes
    fitted to the canvas, and the keyframes VAE-encoded."""
    size = geometry(parts, width, height, frames)
    keyframes, anchors = fit_keyframes(first, last, width, height)
    embeds, tags = encode_prompt(parts, prompt, keyframes)
    conditions = tuple(encode_keyframe(parts, image) for image in keyframes)
    return Request(size, embeds, tags, conditions, anchors)


def reference_size(image: Image.Image, width: int, height: int, mode: str,
                   multiple: int) -> tuple[int, int]:
    """The (width, height) a reference image is encoded at: its aspect kept, scaled down only,
    to the canvas's pixel area ("match") or to a 2048-pixel short edge ("max"), each axis
    rounded to the canvas multiple (ComfyUI's MiniMaxH3ReferenceToVideo)."""
    w, h = image.size
    if mode == "match":
        scale = min(1.0, ((width * height) / (w * h)) ** 0.5)
    elif mode == "max":
        scale = min(1.0, REFERENCE_SHORT_EDGE / min(w, h))
    else:
        raise ValueError(f"mode must be one of {', '.join(REFERENCE_SIZES)}, got {mode!r}")
    return (max(multiple, round(w * scale / multiple) * multiple),
            max(multiple, round(h * scale / multiple) * multiple))


def fit_references(parts: Parts, images: Sequence[Image.Image], width: int, height: int,
                   mode: str) -> list[Image.Image]:
    """The reference images at their encoding size (reference_size), resized with Lanczos;
    a ValueError naming the problem for none, more than 9, or one beyond 1:4 or 4:1."""
    if not images:
        raise ValueError("reference-to-video needs at least one reference image")
    if len(images) > MAX_REFERENCES:
        raise ValueError(f"MiniMax-H3 takes at most {MAX_REFERENCES} reference images, "
                         f"got {len(images)}")
    multiple = parts.vae.spatial_compression_ratio * parts.transformer.config.patch_size[2]
    fitted = []
    for index, image in enumerate(images):
        image = image.convert("RGB")
        w, h = image.size
        if w > 4 * h or h > 4 * w:
            raise ValueError(f"reference image {index + 1} must be within 1:4 and 4:1, "
                             f"got {w}×{h}")
        size = reference_size(image, width, height, mode, multiple)
        fitted.append(image if image.size == size else image.resize(size, Image.Resampling.LANCZOS))
    return fitted


@torch.no_grad()
def prepare_references(parts: Parts, prompt: str, *, width: int, height: int, frames: int,
                       images: Sequence[Image.Image], mode: str = "match") -> Request:
    """The request of a reference-to-video clip (the pipeline's ref2va with image references):
    its sizes, the prompt after a `<Picture i>: ` label and vision block per reference, and
    each reference VAE-encoded at its own size (fit_references)."""
    size = geometry(parts, width, height, frames)
    fitted = fit_references(parts, images, width, height, mode)
    embeds, tags = encode_prompt(parts, prompt, fitted)
    conditions = tuple(encode_keyframe(parts, image) for image in fitted)
    return Request(size, embeds, tags, conditions, references=True)


@torch.no_grad()
def start(parts: Parts, prompt: str, *, width: int, height: int, frames: int, steps: int,
          generator: torch.Generator, first: Image.Image | None = None,
          last: Image.Image | None = None) -> H3Run:
    """A run at its first step (prepare, then begin)."""
    return begin(parts, prepare(parts, prompt, width=width, height=height, frames=frames,
                                first=first, last=last), steps=steps, generator=generator)


@torch.no_grad()
def begin(parts: Parts, request: Request, *, steps: int, generator: torch.Generator,
          shifts: tuple[float, float] = (VIDEO_SHIFT, AUDIO_SHIFT)) -> H3Run:
    """A run at its first step: the layout packed, the noise drawn from `generator` in the
    pipeline's order (one draw per keyframe, then the clip's video, then its audio) and both
    schedules (`shifts`: the video's, the sound's; ComfyUI's MiniMaxH3SigmaShift) set over
    `steps` sigma grid points."""
    from diffusers import MiniMaxH3Scheduler
    from diffusers.modular_pipelines.minimax_h3.before_denoise import patchify_video_latents
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import MINIMAX_H3_AUDIO_CHANNELS
    from diffusers.utils.torch_utils import randn_tensor

    if steps < 2:
        raise ValueError(f"steps must be at least 2 (the sigma grid's points), got {steps}")
    size, embeds, conditions = request.size, request.embeds, request.conditions
    patch = tuple(parts.transformer.config.patch_size)
    position_ids, token_tags, video_idx, audio_idx, text_idx, held = packed_layout(request, patch)
    video_schedule: Any = MiniMaxH3Scheduler(shifts[0])
    audio_schedule: Any = MiniMaxH3Scheduler(shifts[1])
    held_rows = [patchify_video_latents(video_schedule.scale_noise(
        latents, KEYFRAME_T, randn_tensor(latents.shape, generator=generator, dtype=torch.float32,
                                          device=latents.device)),
        patch).cpu() for latents in conditions]  # the run's rows start on the CPU, as its noise
    video_channels = parts.vae.config.latent_channels
    audio_channels = parts.audio_vae.config.latent_channels
    noise = randn_tensor((1, video_channels, size.latent_frames, size.latent_height,
                          size.latent_width), generator=generator, dtype=torch.float32)
    video = torch.cat([*held_rows, patchify_video_latents(noise, patch)])
    audio = randn_tensor((size.audio_latents * MINIMAX_H3_AUDIO_CHANNELS, audio_channels),
                         generator=generator, dtype=torch.float32)
    video_schedule.set_timesteps(steps)
    audio_schedule.set_timesteps(steps)
    layout = {"position_ids": position_ids, "token_tags": token_tags, "video_indices": video_idx,
              "audio_indices": audio_idx, "text_indices": text_idx}
    return H3Run(size, video, audio, embeds, layout, held, video_schedule, audio_schedule)


def packed_layout(request: Request, patch: tuple[int, ...]) -> tuple[Any, ...]:
    """The packed sequence of a request (position_ids, token_tags, video, audio and text
    indices, the held conditioning rows): `[text | keyframes | audio | video]`, or for ref2va
    `[text | one block per reference image | audio | video]`."""
    from diffusers.modular_pipelines.minimax_h3.before_denoise import (
        MiniMaxH3PrepareLayoutStep,
        MiniMaxH3Ref2VAPrepareLayoutStep,
    )
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import (
        MINIMAX_H3_AUDIO_CHANNELS,
        MINIMAX_H3_AUDIO_TAG,
        MINIMAX_H3_VIDEO_TAG,
    )
    from diffusers.modular_pipelines.minimax_h3.references import MiniMaxH3ImageReference

    size = request.size
    shape = (size.latent_frames, size.latent_height, size.latent_width, size.audio_latents)
    if request.references:  # the layout reads only each reference's kind; its size is its latents'
        kinds: list[Any] = [MiniMaxH3ImageReference(image=None)] * len(request.conditions)  # type: ignore[arg-type]
        layout = MiniMaxH3Ref2VAPrepareLayoutStep.build_ref2va_packed_sequence(
            request.tags, kinds, list(request.conditions), [], *shape, patch,  # type: ignore[arg-type]
            MINIMAX_H3_AUDIO_CHANNELS, MINIMAX_H3_AUDIO_TAG, MINIMAX_H3_VIDEO_TAG)
    else:
        layout = MiniMaxH3PrepareLayoutStep.build_packed_sequence(
            request.tags, *shape, patch, MINIMAX_H3_AUDIO_CHANNELS,  # type: ignore[arg-type]
            MINIMAX_H3_AUDIO_TAG, MINIMAX_H3_VIDEO_TAG, request.anchors)
    return layout[:6]


@torch.no_grad()
def forward(transformer: Any, run: H3Run) -> tuple[torch.Tensor, torch.Tensor]:
    """The transformer's data-ward velocities (video [1, N, ·], audio [1, 2·L, ·]) of the run
    at its step: every row at its own timestep (the keyframe rows held at 0.999)."""
    from diffusers.modular_pipelines.minimax_h3.before_denoise import MiniMaxH3SetTimestepsStep

    t = float(run.video_schedule.timesteps[run.step])
    audio_t = float(run.audio_schedule.timesteps[run.step])
    layout = run.layout
    unique, indices = MiniMaxH3SetTimestepsStep.build_row_timesteps(
        layout["video_indices"], layout["audio_indices"], run.held, 0,
        layout["text_indices"].numel(), t, audio_t, max(t, KEYFRAME_T), 1.0)
    video_out, audio_out = transformer(
        hidden_states=run.video[None], audio_hidden_states=run.audio[None],
        encoder_hidden_states=run.embeds, timestep=unique.to(transformer.device),
        timestep_indices=indices.to(transformer.device),
        return_dict=False, **layout)
    return video_out, audio_out


def euler(schedule: Any, step: int, sample: torch.Tensor, velocity: torch.Tensor) -> torch.Tensor:
    """MiniMaxH3Scheduler's Euler step `step` of `sample` along the data-ward `velocity`, its
    arithmetic as it is (x0 = x + (1 − t)·v, then the σ_next / σ blend) without its step counter:
    the same step twice gives the same latents (a batcher's retry)."""
    timestep = schedule.timesteps[step].to(device=sample.device, dtype=sample.dtype)
    denoised = sample + (1 - timestep) * velocity
    sigma = schedule.sigmas[step].to(device=sample.device, dtype=torch.float32)
    sigma_next = schedule.sigmas[step + 1].to(device=sample.device, dtype=torch.float32)
    ratio = sigma_next / sigma
    return (ratio * sample.float() + (1.0 - ratio) * denoised.float()).to(sample.dtype)


def stepped(run: H3Run, outs: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The run's next (video rows, audio rows) after its Euler step on both schedules (the
    keyframe rows untouched); the run is left as it was."""
    video_out, audio_out = outs
    held, i = run.held, run.step
    video = run.video.clone()
    video[held:] = euler(run.video_schedule, i, run.video[held:], video_out[0, held:].float())
    return video, euler(run.audio_schedule, i, run.audio, audio_out[0].float())


def advance(run: H3Run, outs: tuple[torch.Tensor, torch.Tensor]) -> None:
    """The run's Euler step on both schedules (the keyframe rows untouched)."""
    run.video, run.audio = stepped(run, outs)
    run.step += 1


@torch.no_grad()
def render(parts: Parts, prompt: str, *, width: int, height: int, frames: int, steps: int,
           generator: torch.Generator, first: Image.Image | None = None,
           last: Image.Image | None = None) -> Clip:
    """One video + audio render: the pipeline's t2va, or its fl2va with a `first` and/or `last`
    keyframe (`image` / `last_image`), with `output_type="pt"`."""
    run = start(parts, prompt, width=width, height=height, frames=frames, steps=steps,
                generator=generator, first=first, last=last)
    while not run.done:
        advance(run, forward(parts.transformer, run))
    return decode(parts, run.size, run.video[run.held:], run.audio)


def unpatchify(size: Geometry, rows: torch.Tensor, channels: int,
               patch: tuple[int, ...]) -> torch.Tensor:
    """Video rows [N, C·pt·ph·pw] (frame-major, then row-major) → latents [1, C, F, H, W]."""
    pt, ph, pw = patch
    rows = rows.reshape(-1, size.latent_frames // pt, size.latent_height // ph,
                        size.latent_width // pw, channels, pt, ph, pw)
    return rows.permute(0, 4, 1, 5, 2, 6, 3, 7).reshape(
        -1, channels, size.latent_frames, size.latent_height, size.latent_width).contiguous()


@torch.no_grad()
def decode(parts: Parts, size: Geometry, video_rows: torch.Tensor,
           audio_rows: torch.Tensor) -> Clip:
    """The clip of denoised video rows and channel-major audio rows: the video VAE's frames
    (de-normalised latents in, ImageNet pixel statistics out, clamped to [0, 1]) and the mono
    audio VAE's waveform per stereo channel."""
    latents = unpatchify(size, video_rows, parts.vae.config.latent_channels,
                         tuple(parts.transformer.config.patch_size))
    return decode_latents(parts, size, latents, audio_rows)


@torch.no_grad()
def decode_latents(parts: Parts, size: Geometry, latents: torch.Tensor,
                   audio_rows: torch.Tensor) -> Clip:
    """The clip of denoised video latents [1, C, F, h, w] and channel-major audio rows (decode)."""
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import MINIMAX_H3_AUDIO_CHANNELS

    vae, audio_vae = parts.vae, parts.audio_vae
    mean = torch.tensor(vae.config.latents_mean, device=latents.device).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std, device=latents.device).view(1, -1, 1, 1, 1)
    pixels = vae.decode(latents * std + mean, return_dict=False)[0]
    pixel_mean = torch.tensor(PIXEL_MEAN, device=latents.device).view(1, -1, 1, 1, 1)
    pixel_std = torch.tensor(PIXEL_STD, device=latents.device).view(1, -1, 1, 1, 1)
    pixels = (pixels.float() * pixel_std + pixel_mean).clamp(0, 1)
    audio = audio_rows.reshape(MINIMAX_H3_AUDIO_CHANNELS, size.audio_latents, audio_rows.shape[-1])
    audio = audio.permute(0, 2, 1).contiguous()
    audio_mean = torch.tensor(audio_vae.config.latents_mean, device=latents.device).view(1, -1, 1)
    audio_std = torch.tensor(audio_vae.config.latents_std, device=latents.device).view(1, -1, 1)
    waveform = audio_vae.decode(audio * audio_std + audio_mean, return_dict=False)[0]
    return Clip(frames=pixels[0].permute(1, 0, 2, 3).contiguous(),
                audio=waveform.float()[:, 0], sample_rate=int(audio_vae.config.sampling_rate))
