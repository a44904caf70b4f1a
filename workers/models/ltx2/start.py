"""A clip's first state for ltx2/sample (workers/models/ltx2/nodes.py): its noise, drawn
from the seed as the reference pipeline draws it, and its conditioning over the packed video
tokens. `plain`: LTX2Pipeline's / LTX2ImageToVideoPipeline's (5-D noise, ComfyUI's
image-to-video first frame); `guided`: LTX2ConditionPipeline's, for a clip with keyframe guides
(ltx2/add-guide)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from workers.runners.diffusion import noise


def first_state(latent: Any, components: dict[str, Any], sizes: tuple[int, int, int, int],
                seed: int, s0: float, dtype: Any, device: Any) -> ClipStart:
    """The clip latent's (nodes.AvLatent) first state at σ₀ = `s0`: `guided` when it has
    guides, else `plain`. `sizes`: (latent frames, latent height, latent width, audio
    latent length)."""
    return (guided if latent.guides else plain)(latent, components, sizes, seed, s0, dtype,
                                                device)


@dataclass(frozen=True, eq=False)
class ClipStart:
    """A clip's first state: video latents [1, C, F' (+ one frame per appended guide), h, w],
    packed audio latents, and its conditioning as engine.Ltx2Run holds it (held, clean, mixed
    over the packed video tokens; the appended guides' pixel frames and positions)."""

    video: Any
    audio: Any
    held: Any = None
    clean: Any = None
    mixed: Any = None
    guide_frames: tuple[int, ...] = ()
    keyframes: Any = None


def plain(latent: Any, components: dict[str, Any], sizes: tuple[int, int, int, int],
           seed: int, s0: float, dtype: Any, device: Any) -> ClipStart:
    """A clip's first state from `seed`'s noise (video then audio, as LTX2Pipeline draws them),
    for image-to-video the strength on frame 0's tokens and the image packed over every frame.
    A sampled clip is noised to σ₀ = `s0` over itself (LTX2ImageToVideoPipeline's noise_scale),
    the image written into its frame 0 as ComfyUI does; at strength 0 the image is ignored
    (ComfyUI's noise mask 1)."""
    import torch
    from diffusers.pipelines.ltx2.pipeline_ltx2 import LTX2Pipeline

    tcfg, audio_vae = components["transformer"].config, components["audio_vae"]
    f, h, w, audio_len = sizes
    pack = partial(LTX2Pipeline._pack_latents, patch_size=tcfg.patch_size,
                   patch_size_t=tcfg.patch_size_t)
    generator = torch.Generator("cpu").manual_seed(seed)
    video = noise((1, tcfg.in_channels, f, h, w), generator, "cpu")
    if not latent.empty:
        base = latent.samples.float().clone()
        if latent.first is not None:
            base[:, :, :1] = latent.first.float()
        video = s0 * video + (1 - s0) * base
    frame0 = first = None
    if latent.first is not None and latent.strength > 0:
        mask = torch.zeros((1, 1, f, h, w))
        mask[:, :, 0] = 1.0
        image = latent.first.to(dtype).float().repeat(1, 1, f, 1, 1)
        if latent.strength >= 1:  # LTX2ImageToVideoPipeline: frame 0 is the image's
            video = image * mask + video * (1 - mask)
        frame0 = pack(mask * latent.strength).squeeze(-1).to(device)
        first = pack(image).to(device)
    if not latent.empty:  # the packed sound, noised as the pipeline noises it
        audio = noise(tuple(latent.audio.shape), generator, "cpu")
        audio = s0 * audio + (1 - s0) * latent.audio.float().cpu()
    else:
        mel = audio_vae.config.mel_bins // audio_vae.mel_compression_ratio
        audio = noise((1, audio_vae.config.latent_channels, audio_len, mel), generator, "cpu")
        audio = LTX2Pipeline._pack_audio_latents(audio)
    return ClipStart(video.to(device), audio.to(device), frame0, first, frame0)


def guided(latent: Any, components: dict[str, Any],
                  sizes: tuple[int, int, int, int], seed: int, s0: float, dtype: Any,
                  device: Any) -> ClipStart:
    """The first state of a clip with guides, as LTX2ConditionPipeline.prepare_latents makes
    it: a frame-0 guide written over the first frame's tokens, the others' tokens appended
    after the clip's (LTX-2's temporal patch is 1: one latent frame each), then `seed`'s noise
    drawn over all the packed tokens and mixed in at (1 − strength)·σ₀ per token, then the
    packed sound's noise. An image-to-video first frame is held as `plain` holds it."""
    import torch
    from diffusers.pipelines.ltx2.pipeline_ltx2 import LTX2Pipeline

    from workers.models.ltx2.engine import keyframe_coords

    vae, audio_vae = components["vae"], components["audio_vae"]
    tcfg = components["transformer"].config
    f, h, w, audio_len = sizes
    ps, pt = tcfg.patch_size, tcfg.patch_size_t
    pack = partial(LTX2Pipeline._pack_latents, patch_size=ps, patch_size_t=pt)
    per_frame = (h // ps) * (w // ps)  # tokens of one latent frame
    base = (torch.zeros((1, tcfg.in_channels, f, h, w)) if latent.empty
            else latent.samples.float().clone())
    if latent.first is not None and not latent.empty:
        base[:, :, :1] = latent.first.float()
    video = pack(base)  # [1, tokens, C]
    held, clean = torch.zeros(video.shape[:2]), torch.zeros_like(video)
    scales = (vae.temporal_compression_ratio,) + (vae.spatial_compression_ratio,) * 2
    frames, coords = [], []
    for guide in latent.guides:
        tokens = pack(guide.latents.float())  # [1, h·w / p², C]
        if guide.frame == 0:
            video[:, :per_frame] = clean[:, :per_frame] = tokens
            held[:, :per_frame] = guide.strength
            continue
        video, clean = torch.cat([video, tokens], dim=1), torch.cat([clean, tokens], dim=1)
        held = torch.cat([held, torch.full(tokens.shape[:2], guide.strength)], dim=1)
        frames.append(guide.frame)
        coords.append(keyframe_coords(guide.frame, h, w, scales, (ps, pt), latent.fps))
    generator = torch.Generator("cpu").manual_seed(seed)
    scaled = (1.0 - held.unsqueeze(-1)) * s0  # the noise each token starts at
    video = noise(tuple(video.shape), generator, "cpu") * scaled + video * (1 - scaled)
    mixed = None
    if latent.first is not None and latent.strength > 0:  # image-to-video, as `plain` holds it
        image = pack(latent.first.to(dtype).float())
        mixed = torch.zeros_like(held)
        held[:, :per_frame] = mixed[:, :per_frame] = latent.strength
        clean[:, :per_frame] = image
        if latent.strength >= 1:
            video[:, :per_frame] = image
    if latent.empty:
        mel = audio_vae.config.mel_bins // audio_vae.mel_compression_ratio
        audio = noise((1, audio_len, audio_vae.config.latent_channels * mel), generator, "cpu")
    else:
        audio = noise(tuple(latent.audio.shape), generator, "cpu")
        audio = s0 * audio + (1 - s0) * latent.audio.float().cpu()
    video = LTX2Pipeline._unpack_latents(video, f + len(frames), h, w, ps, pt)
    return ClipStart(video.to(device), audio.to(device), held.to(device), clean.to(device),
                  None if mixed is None else mixed.to(device), tuple(frames),
                  torch.cat(coords, dim=2) if coords else None)
