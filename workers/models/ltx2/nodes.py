"""Runners of the LTX-2 family's nodes (descriptors: apps/graphs/nodes_ltx2.py).

    ltx2/empty-latent    → an `AvLatent` of a clip's size: width × height, frames (8k + 1), fps
                           (ComfyUI's EmptyLTXVLatentVideo + LTXVEmptyLatentAudio + concat)
    ltx2/image-to-video  → the latent with its first frame conditioned on an image (encoded as
                           LTX2ImageToVideoPipeline encodes it)
    ltx2/add-guide       → the latent with a keyframe guide at a frame (ComfyUI's LTXVAddGuide,
                           LTX2ConditionPipeline's conditions): frame 0 in place, later ones
                           appended as extra tokens that ltx2/sample crops off again
    ltx2/encode-audio    → the latent with its sound given (ComfyUI's LTXVAudioVAEEncode, kept by
                           SetLatentNoiseMask of an all-0 mask): ltx2/sample keeps it as it is
    ltx2/sample          → the denoised video + audio latents (LTX2Pipeline's guidance), on the
                           model's step batcher: runs of one clip size share every forward;
                           wired sigmas (sampling/manual-sigmas) replace its schedule, and
                           refine a sampled clip from their first noise level
    ltx2/upsample-latent → the sampled clip's video latents ×2 in space (a latent_upscale_models/
                           file, load/latent-upscale-model), its sound kept
    ltx2/decode          → a `Video`: the frames at the clip's fps with the vocoder's sound
The latent's sizes in latent space come from the loaded pipeline (its VAEs' ratios): a clip's
latent is sized by the sampler, which knows the model.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Any

from workers.device.thread import on_device_thread
from workers.models.values import Conditioning, DiffusionModel, Latent, Vae
from workers.runners.base import NodeContext, NodeFailed, runner
from workers.runners.diffusion import checked, encode, expect, loaded

FAMILY = "ltx2"


@dataclass(frozen=True, eq=False)
class Guide:
    """A keyframe guide (ltx2/add-guide): an image's normalised latents [1, C, 1, h, w] held
    at pixel `frame` of the clip at `strength` (1: held; below: its tokens denoise too)."""

    latents: Any
    frame: int
    strength: float


@dataclass(frozen=True, eq=False)
class AvLatent(Latent):
    """LTX-2's audio + video latent (ComfyUI's LTXVConcatAVLatent's AV latent). Empty: `samples`
    is [1, 0, 1, H, W] (the pixel size, downscale 1) and `frames`, `fps` the clip's; sampled:
    the video latents [1, C, F', h, w] and the packed audio latents `audio` [1, L, C·M] of
    `audio_frames` frames. `first`: image-to-video's first-frame latents [1, C, 1, h, w] at
    `strength`; `guides`: ltx2/add-guide's keyframes (at most one at frame 0, which replaces
    `first`). An empty clip's `audio` may be given (ltx2/encode-audio): `audio_kept`, the
    sampler keeps it as it is (its tokens clean), as it keeps a sampled clip's given sound."""

    frames: int = 0
    fps: float = 25.0
    audio: Any = None
    audio_frames: int = 0
    first: Any = None
    strength: float = 1.0  # the first frame's conditioning strength (ComfyUI's, 1: held)
    guides: tuple[Guide, ...] = ()
    audio_kept: bool = False


def _empty(width: int, height: int, frames: int, fps: float) -> AvLatent:
    import torch

    if width <= 0 or height <= 0 or width % 32 or height % 32:
        raise NodeFailed(f"LTX-2 frame sides must be positive multiples of 32, got "
                         f"{width}×{height}")
    if frames < 1:
        raise NodeFailed(f"an LTX-2 clip has at least 1 frame, got {frames}")
    if fps <= 0:
        raise NodeFailed(f"fps must be positive, got {fps}")
    # the 8k + 1 frames the VAE makes (ComfyUI's latent length: (frames − 1) // 8 + 1)
    return AvLatent(torch.zeros((1, 0, 1, height, width)), empty=True, downscale=1,
                    frames=(frames - 1) // 8 * 8 + 1, fps=fps)


@runner("ltx2/empty-latent")
def empty_latent(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    width, height, frames = (int(inputs.get(k, params[k])) for k in ("width", "height", "length"))
    return {"latent": _empty(width, height, frames, float(inputs.get("fps", params["fps"])))}


def _av(inputs: dict[str, Any]) -> AvLatent:
    latent = inputs.get("latent")
    if not isinstance(latent, AvLatent):
        got = "nothing" if latent is None else "another family's latent"
        raise NodeFailed(f"input 'latent' must be an LTX-2 latent (ltx2/empty-latent), got {got}")
    return latent


def _components(value: Any, what: str) -> dict[str, Any]:
    if value.family != FAMILY:
        raise NodeFailed(f"{what} {value.name} is a {value.family} model, not LTX-2's")
    return value.module if isinstance(value, Vae) else value.model


@runner("ltx2/image-to-video")
def image_to_video(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    """The first frame's latents of `image` (H.264 re-compressed at `crf`, −1: the model's
    default, resized bilinearly, the VAE's mode), as LTX2ImageToVideoPipeline makes them, at
    the clip's size: an empty clip's, or a sampled one's (ComfyUI's second-stage
    LTXVImgToVideoInplace over the upsampled clip)."""
    from PIL import Image

    from workers.models.ltx2.engine import encode_first_frame

    latent = _av(inputs)
    vae = expect(inputs, "vae", Vae)
    components = _components(vae, "vae")
    image = expect(inputs, "image", Image.Image).convert("RGB")
    crf, strength = int(params["crf"]), float(params.get("strength", 1.0))
    if not 0 <= strength <= 1:
        raise NodeFailed(f"strength must be between 0 and 1, got {strength}")
    width, height = latent.pixel_size
    dtype = components["text_encoder"].dtype
    first = checked(lambda: on_device_thread(encode_first_frame, components, image, width, height,
                                             None if crf < 0 else crf, dtype))
    return {"latent": replace(latent, first=first.float().cpu(), strength=strength,
                              guides=tuple(g for g in latent.guides if g.frame != 0))}


@runner("ltx2/encode-audio")
def encode_audio(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    """The clip latent with `audio` as its sound: the audio VAE's latents of it (ComfyUI's
    LTXVAudioVAEEncode), kept as they are by ltx2/sample (`keep`, ComfyUI's noise mask 0) or
    its starting point (mask 1: noised to the sampler's first σ, as a sampled clip's is)."""
    from workers.models.ltx2.sound import encode_audio as encode_sound
    from workers.models.values import Audio

    latent = _av(inputs)
    components = _components(expect(inputs, "vae", Vae), "vae")
    audio = expect(inputs, "audio", Audio)
    if audio.samples.shape[-1] == 0:
        raise NodeFailed("the sound is empty (0 samples)")
    try:
        packed = checked(lambda: on_device_thread(encode_sound, components, audio.samples,
                                                  audio.sample_rate))
    except ValueError as exc:
        raise NodeFailed(str(exc)) from None
    return {"latent": replace(latent, audio=packed, audio_frames=int(packed.shape[1]),
                              audio_kept=bool(params["keep"]))}


def _guide_frame(frame_idx: int, frames: int) -> int:
    """The pixel frame of ComfyUI's LTXVAddGuide `frame_idx` in a clip of `frames` frames:
    itself, or counted from the end when negative (−1: the last)."""
    if not -frames <= frame_idx < frames:
        raise NodeFailed(f"frame_idx {frame_idx} is outside the clip's {frames} frames (0 to "
                         f"{frames - 1}, or -{frames} to -1 counted from the end)")
    return frame_idx if frame_idx >= 0 else frames + frame_idx


@runner("ltx2/add-guide")
def add_guide(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    """The clip latent with `image` as a keyframe guide at `frame_idx` (ComfyUI's LTXVAddGuide,
    LTX2ConditionPipeline's condition): encoded at the clip's size (cut to its aspect and
    scaled as ComfyUI does); at frame 0 it replaces the image-to-video first frame. The
    prompts pass on unchanged (the guides ride on the latent)."""
    from PIL import Image

    from workers.models.ltx2.engine import encode_guide

    latent = _av(inputs)
    positive = expect(inputs, "positive", Conditioning)
    negative = inputs.get("negative")
    components = _components(expect(inputs, "vae", Vae), "vae")
    image = expect(inputs, "image", Image.Image)
    crf, strength = int(params["crf"]), float(params["strength"])
    if not 0 <= strength <= 1:
        raise NodeFailed(f"strength must be between 0 and 1, got {strength}")
    frame = _guide_frame(int(params["frame_idx"]), latent.frames)
    width, height = latent.pixel_size
    encoded = checked(lambda: on_device_thread(encode_guide, components, image, width, height,
                                               None if crf < 0 else crf))
    guide = Guide(encoded.cpu(), frame, strength)
    kept = tuple(g for g in latent.guides if frame != 0 or g.frame != 0)
    out = replace(latent, guides=(*kept, guide), first=None if frame == 0 else latent.first)
    return {"positive": positive, "negative": negative, "latent": out}


def _guidance(params: dict[str, Any], layers: int) -> Any:
    from workers.models.ltx2.engine import Guidance

    text = str(params.get("stg_blocks", "28")).replace(" ", "")
    try:
        blocks = tuple(int(b) for b in text.split(",") if b)
    except ValueError:
        raise NodeFailed(f"stg_blocks must be block numbers separated by commas, got {text!r}") from None
    g = Guidance(cfg=float(params["cfg"]), stg=float(params["stg"]),
                 modality=float(params["modality"]), rescale=float(params["rescale"]),
                 audio_cfg=float(params["audio_cfg"]), audio_stg=float(params["audio_stg"]),
                 audio_modality=float(params["audio_modality"]),
                 audio_rescale=float(params["audio_rescale"]), stg_blocks=blocks)
    if g.do_stg and (not blocks or any(not 0 <= b < layers for b in blocks)):
        raise NodeFailed(f"stg_blocks {text!r}: the transformer has blocks 0–{layers - 1} "
                         "(LTX-2's 48: the pipeline perturbs 28)")
    return g


def _sigmas(inputs: dict[str, Any], empty: bool) -> Any:
    """The wired sigmas' values ([n + 1], from σ₀ down to the last), or None (unwired: the
    pipeline's schedule). An empty clip latent starts from pure noise (σ₀ = 1); a sampled one
    (the two-stage workflows' upsampled clip) is refined from σ₀ ≤ 1 over wired sigmas."""
    from workers.models.values import Sigmas

    value = inputs.get("sigmas")
    if value is None and not empty:
        raise NodeFailed("a sampled clip latent is refined over wired sigmas (ManualSigmas, "
                         "from the noise level to refine at): wire sigmas, or start from "
                         "ltx2/empty-latent")
    if value is None:
        return None
    if not isinstance(value, Sigmas) or value.values is None:
        raise NodeFailed("input 'sigmas' must be sigmas written by hand (sampling/manual-sigmas):"
                         " leave it unwired for LTX2Pipeline's schedule")
    values = [float(v) for v in value.values]
    if len(values) < 2:
        raise NodeFailed(f"sigmas {values} hold no step: give at least two (first to last)")
    if (values[0] != 1.0 if empty else not 0 < values[0] <= 1.0) or values[-1] < 0:
        start = "1 (an empty clip latent is pure noise)" if empty else "at most 1"
        raise NodeFailed(f"sigmas {values} must run from {start} down to 0 or above")
    if any(b >= a for a, b in pairwise(values)):
        raise NodeFailed(f"sigmas {values} must fall at every step")
    return value.values


@runner("ltx2/sample")
def sample(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    """LTX2Pipeline's denoise of a clip's video and audio latents from `seed`'s noise (video
    then audio, as the pipeline draws them), its resolution-shifted schedule and its guidance,
    one job on the model's step batcher. A clip with guides (ltx2/add-guide) starts and steps
    as LTX2ConditionPipeline's, and comes back without the guides' frames (ComfyUI's
    LTXVCropGuides)."""
    import torch

    from workers.models.ltx2.engine import Ltx2Run, latent_sizes, manual_schedule, schedule
    from workers.models.ltx2.plugin import AUDIO, PATCH, PREVIEW_VAE, RUN, Prompt, components_of
    from workers.models.ltx2.start import first_state
    from workers.runners.diffusion import denoise_job

    model = expect(inputs, "model", DiffusionModel)
    if model.family != FAMILY:
        raise NodeFailed(f"ltx2/sample samples LTX-2 models; {model.name} is {model.family}'s")
    positive = expect(inputs, "positive", Conditioning)
    if positive.encoder.family != FAMILY:
        raise NodeFailed(f"input 'positive' was encoded by {positive.encoder.name} "
                         f"({positive.encoder.family}): use the LTX-2 checkpoint's encoder")
    latent = _av(inputs)
    manual = _sigmas(inputs, latent.empty)
    components = components_of(model.transformer)
    transformer, vae = components["transformer"], components["vae"]
    tcfg = transformer.config
    g = _guidance(params, int(tcfg.num_layers))
    seed, steps = int(inputs.get("seed", params["seed"])), int(params["steps"])
    width, height = latent.pixel_size
    ratio = vae.spatial_compression_ratio
    if width % ratio or height % ratio:
        raise NodeFailed(f"{model.name} makes frames of multiples of {ratio} pixels, got "
                         f"{width}×{height}")
    if (latent.frames - 1) % vae.temporal_compression_ratio:
        raise NodeFailed(f"{model.name} makes clips of {vae.temporal_compression_ratio}k + 1 "
                         f"frames, got {latent.frames}")
    f, h, w, audio_len = latent_sizes(components, width, height, latent.frames, latent.fps)
    if latent.audio is not None:  # a sampled clip's sound, or a given one (its own length)
        audio_len = latent.audio_frames
    if ((not latent.empty and tuple(latent.samples.shape[1:]) != (tcfg.in_channels, f, h, w))
            or (latent.audio is not None
                and latent.audio.shape[-1] != tcfg.audio_in_channels)):
        raise NodeFailed(f"the clip latent does not fit {model.name} (another model's clip?)")
    pos: Prompt = positive.embeds
    rows = [pos]
    if g.do_cfg:
        negative = inputs.get("negative")
        if negative is not None and not isinstance(negative, Conditioning):
            raise NodeFailed(f"input 'negative' must be conditioning, got {type(negative).__name__}")
        rows = [negative.embeds if negative is not None else encode(positive.encoder, ""), pos]
    device = model.placement.device
    dtype = pos.video.dtype
    encoded = [latent.first] if latent.first is not None else []
    if any(tuple(e.shape[-2:]) != (h, w) for e in encoded + [g.latents for g in latent.guides]):
        raise NodeFailed("the image-to-video or guide latent was encoded by another VAE")
    s0 = float(manual[0]) if manual is not None else 1.0
    begin = on_device_thread(first_state, latent, components, (f, h, w, audio_len), seed, s0,
                             dtype, device)
    video, audio = begin.video, begin.audio
    if manual is not None:
        sigmas, timesteps = manual_schedule(manual)
    else:  # the shift counts the guides' tokens too (LTX2ConditionPipeline's)
        _, sigmas, timesteps = schedule(components["scheduler"], steps, video.shape[2] * h * w
                                        // (tcfg.patch_size ** 2 * tcfg.patch_size_t))
    sigmas, timesteps = sigmas.to(device), timesteps.to(device)
    prompts = [p.to(device) for p in rows]
    run = Ltx2Run(video, audio, torch.cat([p.video for p in prompts]),
                  torch.cat([p.audio for p in prompts]), torch.cat([p.mask for p in prompts]),
                  sigmas, timesteps, f, h, w, audio_len, latent.fps, g, held=begin.held,
                  clean=begin.clean, mixed=begin.mixed, guide_frames=begin.guide_frames,
                  keyframe_coords=begin.keyframes, audio_kept=latent.audio_kept)
    extra: dict[str, Any] = {RUN: run, AUDIO: {0: audio},
                             PATCH: (tcfg.patch_size, tcfg.patch_size_t), PREVIEW_VAE: vae}
    ctx.note_lineage(seed=seed)
    from workers.models.ltx2.plugin import advance

    out = denoise_job(ctx, model, video, sigmas, timesteps, prompts[-1].video[0],
                      prompts[0].video[0] if g.do_cfg else None,
                      max(g.cfg, 1e-3) if g.do_cfg else 0.0, extra=extra, advance=advance,
                      frames=latent.frames)
    return {"latent": AvLatent(out[:, :, :f], downscale=ratio, frames=latent.frames,
                               fps=latent.fps, audio=extra[AUDIO][len(timesteps)],
                               audio_frames=audio_len, audio_kept=latent.audio_kept)}
    # (the guides' frames cropped off; a given sound stays given for a second stage, as
    # ComfyUI's noise mask rides on the sampled latent)


@runner("ltx2/load-files")
def load_files(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    """ComfyUI's separate LTX-2 files as (model, text encoder, VAE) (plugin.load_files)."""
    from workers.models.ltx2.files import FOLDERS, ROLES
    from workers.models.ltx2.plugin import load_files as load_values

    names = {role: str(params[role]) for role in ROLES}
    model, encoder, vae = loaded(ctx, lambda: load_values(ctx.models_dir, names, ctx.policy),
                                 " + ".join(f"{FOLDERS[r]}/{names[r]}" for r in ROLES))
    return {"model": model, "encoder": encoder, "vae": vae}


@runner("load/latent-upscale-model")
def load_latent_upscale_model(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    """`latent_upscale_models/<file>` as an LTX-2 latent upsampler (workers/models/ltx2/upsampler)."""
    from workers.models.catalog import ModelFileMissing
    from workers.models.family import ModelLoadError
    from workers.models.ltx2.upsampler import FOLDER, load_latent_upsampler

    name = str(params["file"])

    def load() -> Any:
        return load_latent_upsampler(ctx.models_dir, name, ctx.policy)

    try:  # as load/upscale-model: on the device thread on CPU, on the slot on a GPU
        model = on_device_thread(load) if ctx.policy.device == "cpu" else load()
    except (ModelFileMissing, ModelLoadError) as exc:
        raise NodeFailed(str(exc)) from exc
    ctx.note_lineage(models={**ctx.lineage.get("models", {}), f"{FOLDER}/{name}": model.sha256})
    return {"latent_upscale_model": model}


@runner("ltx2/upsample-latent")
def upsample_latent(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    """The sampled clip's video latents through the upsampler (twice the width and height),
    its sound and fps kept; an image-to-video first frame and guides are not carried over
    (ComfyUI drops the noise mask too: condition the upsampled clip again)."""
    from workers.models.ltx2.upsampler import LatentUpscaleModel, upsample

    latent = _av(inputs)
    if latent.empty:
        raise NodeFailed("an empty latent holds no clip to upsample: sample it first "
                         "(ltx2/sample)")
    model = expect(inputs, "latent_upscale_model", LatentUpscaleModel)
    vae = _components(expect(inputs, "vae", Vae), "vae")["vae"]
    channels = model.net.config.in_channels
    if latent.samples.shape[1] != channels:
        raise NodeFailed(f"{model.name} upsamples {channels}-channel latents; the clip's have "
                         f"{latent.samples.shape[1]} (another model's upsampler?)")
    out = checked(lambda: on_device_thread(upsample, model, vae, latent.samples))
    return {"latent": replace(latent, samples=out, first=None, guides=())}


@runner("ltx2/decode")
def decode(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    """The clip of a sampled LTX-2 latent: frames (video VAE) at its fps, sound (audio VAE +
    vocoder)."""
    from workers.models.ltx2.engine import decode_av
    from workers.models.values import Audio, Frames, Video

    latent = _av(inputs)
    if latent.empty:
        raise NodeFailed("an empty latent holds no clip: sample it first (ltx2/sample)")
    components = _components(expect(inputs, "vae", Vae), "vae")
    dtype = components["text_encoder"].dtype
    frames, wave, rate = checked(lambda: on_device_thread(
        decode_av, components, latent.samples.to(dtype), latent.audio, latent.audio_frames))
    return {"video": Video(Frames(frames), latent.fps, Audio(wave, rate))}
