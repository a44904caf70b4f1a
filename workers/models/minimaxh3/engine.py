"""MiniMax-H3 text-to-video + audio through diffusers 0.42's own modules, reproducing
`MiniMaxH3ModularPipeline`'s t2va workflow step for step on CPU: the Qwen3-VL hidden state after
layer 50 of the prompt, the packed `[text | audio | video]` sequence with its rotary grid, the
two MiniMax-H3 schedules (video shift 12, audio shift 3) stepped inside one transformer call per
step, and the video VAE decode to frames in [0, 1] plus the audio VAE decode to a stereo waveform.

The checkpoint is guidance-distilled: one forward per step, no negative prompt. As in the
pipeline, `steps` counts the sigma grid's points, so a render runs `steps − 1` forwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

MIN_SECONDS, MAX_SECONDS = 5.0, 15.0  # MiniMaxH3ModularPipeline.min_duration / max_duration
VIDEO_SHIFT, AUDIO_SHIFT = 12.0, 3.0


@dataclass
class Parts:
    """The modules of one MiniMax-H3 stack (diffusers' component names)."""

    transformer: Any
    vae: Any
    audio_vae: Any
    text_encoder: Any
    tokenizer: Any
    processor: Any


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
def encode_prompt(parts: Parts, prompt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompt's conditioning [1, L, D] (Qwen3-VL's hidden state after layer 50, the prompt
    verbatim without special tokens) and its rows' modality tags [L] (all text)."""
    from diffusers.modular_pipelines.minimax_h3.encoders import get_qwen3vl_prompt_embeds
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import MINIMAX_H3_TEXT_TAG

    token_ids = parts.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    embeds = get_qwen3vl_prompt_embeds(parts.text_encoder, parts.processor, token_ids, {},
                                       text_encoder_layer=50, device=parts.transformer.device,
                                       dtype=parts.text_encoder.dtype)
    return embeds, torch.full((len(token_ids),), MINIMAX_H3_TEXT_TAG, dtype=torch.long)


@torch.no_grad()
def render(parts: Parts, prompt: str, *, width: int, height: int, frames: int, steps: int,
           generator: torch.Generator) -> Clip:
    """One text-to-video + audio render (the pipeline's t2va with `output_type="pt"`)."""
    from diffusers import MiniMaxH3Scheduler
    from diffusers.modular_pipelines.minimax_h3.before_denoise import (
        MiniMaxH3PrepareLayoutStep,
        MiniMaxH3SetTimestepsStep,
        patchify_video_latents,
    )
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import (
        MINIMAX_H3_AUDIO_CHANNELS,
        MINIMAX_H3_AUDIO_TAG,
        MINIMAX_H3_VIDEO_TAG,
    )
    from diffusers.utils.torch_utils import randn_tensor

    if steps < 2:
        raise ValueError(f"steps must be at least 2 (the sigma grid's points), got {steps}")
    size = geometry(parts, width, height, frames)
    embeds, tags = encode_prompt(parts, prompt)
    patch = tuple(parts.transformer.config.patch_size)
    position_ids, token_tags, video_idx, audio_idx, text_idx, _, _ = \
        MiniMaxH3PrepareLayoutStep.build_packed_sequence(
            tags, size.latent_frames, size.latent_height, size.latent_width, size.audio_latents,
            patch, MINIMAX_H3_AUDIO_CHANNELS, MINIMAX_H3_AUDIO_TAG, MINIMAX_H3_VIDEO_TAG, ())
    video_channels = parts.vae.config.latent_channels
    audio_channels = parts.audio_vae.config.latent_channels
    noise = randn_tensor((1, video_channels, size.latent_frames, size.latent_height,
                          size.latent_width), generator=generator, dtype=torch.float32)
    video = patchify_video_latents(noise, patch)
    audio = randn_tensor((size.audio_latents * MINIMAX_H3_AUDIO_CHANNELS, audio_channels),
                         generator=generator, dtype=torch.float32)
    video_schedule: Any = MiniMaxH3Scheduler(VIDEO_SHIFT)
    audio_schedule: Any = MiniMaxH3Scheduler(AUDIO_SHIFT)
    video_schedule.set_timesteps(steps)
    audio_schedule.set_timesteps(steps)
    layout = {"position_ids": position_ids, "token_tags": token_tags, "video_indices": video_idx,
              "audio_indices": audio_idx, "text_indices": text_idx}
    for t, audio_t in zip(video_schedule.timesteps, audio_schedule.timesteps, strict=True):
        unique, indices = MiniMaxH3SetTimestepsStep.build_row_timesteps(
            video_idx, audio_idx, 0, 0, text_idx.numel(), float(t), float(audio_t),
            max(float(t), 0.999), 1.0)
        video_out, audio_out = parts.transformer(
            hidden_states=video[None], audio_hidden_states=audio[None],
            encoder_hidden_states=embeds, timestep=unique, timestep_indices=indices,
            return_dict=False, **layout)
        video = video_schedule.step(video_out[0].float(), t, video, return_dict=False)[0]
        audio = audio_schedule.step(audio_out[0].float(), audio_t, audio, return_dict=False)[0]
    return decode(parts, size, video, audio)


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
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import MINIMAX_H3_AUDIO_CHANNELS

    vae, audio_vae = parts.vae, parts.audio_vae
    latents = unpatchify(size, video_rows, vae.config.latent_channels,
                         tuple(parts.transformer.config.patch_size))
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    pixels = vae.decode(latents * std + mean, return_dict=False)[0]
    pixel_mean = torch.tensor((0.485, 0.456, 0.406)).view(1, -1, 1, 1, 1)
    pixel_std = torch.tensor((0.229, 0.224, 0.225)).view(1, -1, 1, 1, 1)
    pixels = (pixels.float() * pixel_std + pixel_mean).clamp(0, 1)
    audio = audio_rows.reshape(MINIMAX_H3_AUDIO_CHANNELS, size.audio_latents, audio_rows.shape[-1])
    audio = audio.permute(0, 2, 1).contiguous()
    audio_mean = torch.tensor(audio_vae.config.latents_mean).view(1, -1, 1)
    audio_std = torch.tensor(audio_vae.config.latents_std).view(1, -1, 1)
    waveform = audio_vae.decode(audio * audio_std + audio_mean, return_dict=False)[0]
    return Clip(frames=pixels[0].permute(1, 0, 2, 3).contiguous(),
                audio=waveform.float()[:, 0], sample_rate=int(audio_vae.config.sampling_rate))
