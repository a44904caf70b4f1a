"""Runners of the MiniMax-H3 family's nodes (descriptors: apps/graphs/nodes_minimaxh3.py).

    minimaxh3/image-to-video → the prompt's conditioning (with its keyframes' vision blocks) and
                               an empty `H3Latent` holding the clip's sizes and keyframes
                               (ComfyUI's MiniMaxH3ImageToVideo)
    minimaxh3/reference-to-video → the same from 1..9 reference images (ComfyUI's
                               MiniMaxH3ReferenceToVideo; the pipeline's ref2va)
    minimaxh3/sample         → the denoised video latents + audio rows, one job on the model's
                               step batcher (each run its own forward: packed sequences differ)
    minimaxh3/decode         → a `Video`: the frames at 24 fps with the stereo sound
    minimaxh3/load-files     → (model, text encoder, VAE) of ComfyUI's four parts
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from workers.device.thread import on_device_thread
from workers.models.values import Conditioning, DiffusionModel, Latent, TextEncoder, Vae
from workers.runners.base import NodeContext, NodeFailed, runner
from workers.runners.diffusion import checked, expect, loaded

FAMILY = "minimaxh3"


@dataclass(frozen=True, eq=False)
class H3Latent(Latent):
    """MiniMax-H3's clip latent: `request` (engine.Request: sizes, keyframes; its prompt rides
    on the conditioning). Empty: `samples` is [1, 0, 1, H, W] (the pixel size, downscale 1);
    sampled: the video latents [1, C, F', h, w] and the channel-major audio rows `audio`."""

    request: Any = None
    audio: Any = None


def _h3(inputs: dict[str, Any]) -> H3Latent:
    latent = inputs.get("latent")
    if not isinstance(latent, H3Latent):
        got = "nothing" if latent is None else "another family's latent"
        raise NodeFailed("input 'latent' must be a MiniMax-H3 latent "
                         f"(minimaxh3/image-to-video or /reference-to-video), got {got}")
    return latent


def _parts(value: Any, what: str) -> Any:
    if value.family != FAMILY:
        raise NodeFailed(f"{what} {value.name} is a {value.family} model, not MiniMax-H3's")
    return value.module if isinstance(value, Vae) else value.model


@runner("minimaxh3/image-to-video")
def image_to_video(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    """The prompt encoded with its first / last frame (each fitted to the canvas) and the clip's
    empty latent with the frames VAE-encoded (engine.prepare)."""
    import torch
    from PIL import Image

    from workers.models.minimaxh3.engine import prepare
    from workers.models.minimaxh3.plugin import Prompt

    encoder = expect(inputs, "encoder", TextEncoder)
    parts = replace(_parts(encoder, "encoder"), vae=_parts(expect(inputs, "vae", Vae), "vae").vae)
    prompt = str(inputs.get("prompt", params["prompt"]))
    width, height, length = (int(inputs.get(k, params[k])) for k in ("width", "height", "length"))
    ends = {}
    for port in ("first_frame", "last_frame"):
        image = inputs.get(port)
        if image is not None and not isinstance(image, Image.Image):
            raise NodeFailed(f"input {port!r} must be an image, got {type(image).__name__}")
        ends[port] = image
    request = checked(lambda: on_device_thread(lambda: prepare(
        parts, prompt, width=width, height=height, frames=length, first=ends["first_frame"],
        last=ends["last_frame"])))
    positive = Conditioning(Prompt(request.embeds, request.tags, len(request.conditions)),
                            prompt, encoder)
    empty = torch.zeros((1, 0, 1, height, width))
    return {"positive": positive,
            "latent": H3Latent(empty, empty=True, downscale=1, request=request)}


@runner("minimaxh3/reference-to-video")
def reference_to_video(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    """The prompt encoded after its wired images (image1..image9, in order) and the clip's
    empty latent with the images VAE-encoded at their sizes (engine.prepare_references)."""
    import torch
    from PIL import Image

    from workers.models.minimaxh3.engine import MAX_REFERENCES, prepare_references
    from workers.models.minimaxh3.plugin import Prompt

    encoder = expect(inputs, "encoder", TextEncoder)
    parts = replace(_parts(encoder, "encoder"), vae=_parts(expect(inputs, "vae", Vae), "vae").vae)
    prompt = str(inputs.get("prompt", params["prompt"]))
    width, height, length = (int(inputs.get(k, params[k])) for k in ("width", "height", "length"))
    images = []
    for port in (f"image{i}" for i in range(1, MAX_REFERENCES + 1)):
        image = inputs.get(port)
        if image is not None and not isinstance(image, Image.Image):
            raise NodeFailed(f"input {port!r} must be an image, got {type(image).__name__}")
        if image is not None:
            images.append(image)
    if not images:
        raise NodeFailed("wire at least one reference image (image1..image9)")
    request = checked(lambda: on_device_thread(lambda: prepare_references(
        parts, prompt, width=width, height=height, frames=length, images=images,
        mode=str(params.get("mode", "match")))))
    positive = Conditioning(Prompt(request.embeds, request.tags, len(request.conditions)),
                            prompt, encoder)
    empty = torch.zeros((1, 0, 1, height, width))
    return {"positive": positive,
            "latent": H3Latent(empty, empty=True, downscale=1, request=request)}


@runner("minimaxh3/sample")
def sample(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    """MiniMaxH3ModularPipeline's denoise of the clip from `seed`'s noise (engine.begin over
    `steps` + 1 sigma grid points), one job on the model's step batcher."""
    import torch

    from workers.models.minimaxh3.engine import AUDIO_SHIFT, VIDEO_SHIFT, begin, unpatchify
    from workers.models.minimaxh3.plugin import AUDIO, PATCH, RUN, Prompt, parts_of
    from workers.runners.diffusion import denoise_job

    model = expect(inputs, "model", DiffusionModel)
    if model.family != FAMILY:
        raise NodeFailed(f"minimaxh3/sample samples MiniMax-H3 models; {model.name} is "
                         f"{model.family}'s")
    positive = expect(inputs, "positive", Conditioning)
    if positive.encoder.family != FAMILY or not isinstance(positive.embeds, Prompt):
        raise NodeFailed(f"input 'positive' was encoded by {positive.encoder.name} "
                         f"({positive.encoder.family}): use minimaxh3/image-to-video's or "
                         "/reference-to-video's")
    latent = _h3(inputs)
    if not latent.empty:
        raise NodeFailed("the latent was sampled already: minimaxh3/sample starts from "
                         "minimaxh3/image-to-video's or /reference-to-video's empty latent")
    prompt: Prompt = positive.embeds
    keyframes = len(latent.request.conditions)
    if prompt.keyframes != keyframes:
        raise NodeFailed(f"input 'positive' was encoded with {prompt.keyframes} image(s) and "
                         f"the latent holds {keyframes}: wire both from one "
                         "minimaxh3/image-to-video or /reference-to-video")
    parts = parts_of(model.transformer)
    if latent.request.references and parts.keyframe_partition:
        raise NodeFailed(f"{model.name}'s transformer/ is MiniMax-H3's first/last-frame "
                         "partition: reference-to-video runs on its transformer_ref/ weights — "
                         "put that folder in diffusion_models/ and load it with "
                         "minimaxh3/load-files")
    seed, steps = (int(inputs.get(k, params[k])) for k in ("seed", "steps"))
    if steps < 1:
        raise NodeFailed(f"steps must be at least 1, got {steps}")
    shifts = (float(params.get("shift_video", VIDEO_SHIFT)),
              float(params.get("shift_audio", AUDIO_SHIFT)))  # .get: graphs stored before them
    request = replace(latent.request, embeds=prompt.embeds, tags=prompt.tags)
    generator = torch.Generator("cpu").manual_seed(seed)
    run = checked(lambda: on_device_thread(lambda: begin(parts, request, steps=steps + 1,
                                                         generator=generator, shifts=shifts)))
    device = model.placement.device
    run = replace(run, embeds=run.embeds.to(device), video=run.video.to(device),
                  audio=run.audio.to(device),
                  layout={k: v.to(device) for k, v in run.layout.items()})
    patch = tuple(parts.transformer.config.patch_size)
    noise = unpatchify(run.size, run.video[run.held:], parts.vae.config.latent_channels, patch)
    extra: dict[str, Any] = {RUN: run, AUDIO: {0: run.audio}, PATCH: patch}
    ctx.note_lineage(seed=seed)
    schedule = run.video_schedule
    out = denoise_job(ctx, model, noise, schedule.sigmas, schedule.timesteps, run.embeds[0],
                      None, 0.0, extra=extra, frames=run.size.frames)
    return {"latent": H3Latent(out, downscale=parts.vae.spatial_compression_ratio,
                               request=latent.request, audio=extra[AUDIO][run.steps])}


@runner("minimaxh3/decode")
def decode(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    """The clip of a sampled MiniMax-H3 latent: frames (video VAE) at 24 fps, stereo sound
    (audio VAE)."""
    from workers.models.minimaxh3.engine import decode_latents
    from workers.models.values import Audio, Frames, Video

    latent = _h3(inputs)
    if latent.empty:
        raise NodeFailed("an empty latent holds no clip: sample it first (minimaxh3/sample)")
    parts = _parts(expect(inputs, "vae", Vae), "vae")
    dtype = parts.vae.dtype
    clip = checked(lambda: on_device_thread(decode_latents, parts, latent.request.size,
                                            latent.samples.to(dtype), latent.audio.to(dtype)))
    frames = (clip.frames.permute(0, 2, 3, 1).cpu().numpy() * 255).round().astype("uint8")
    return {"video": Video(Frames(frames), float(clip.fps),
                           Audio(clip.audio.cpu().numpy(), clip.sample_rate))}


@runner("minimaxh3/load-files")
def load_files(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    """ComfyUI's four MiniMax-H3 parts as (model, text encoder, VAE) (plugin.load_files)."""
    from workers.models.minimaxh3.loading import FILE_ROLES
    from workers.models.minimaxh3.plugin import load_files as load_values

    names = {role: str(params[role]) for role in FILE_ROLES}
    model, encoder, vae = loaded(ctx, lambda: load_values(ctx.models_dir, names, ctx.policy),
                                 " + ".join(names[r] for r in FILE_ROLES))
    return {"model": model, "encoder": encoder, "vae": vae}
