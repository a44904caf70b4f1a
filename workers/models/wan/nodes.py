"""Runners of the Wan family's video nodes (descriptors: apps/graphs/nodes_wan.py).

    latent/empty-video → Latent [1, 16, F', H/8, W/8] zeros (empty: a sampler starts from noise)
    vae/decode-video   → Frames [F, H, W, 3] uint8
    frames/image       → one frame as a PIL RGB image
    wan/image-to-video → positive / negative Conditioning carrying `condition` [1, 20, F', h, w]
                         (its SampleJobs' `extra`), and the clip's empty latent
    wan/ti2v-latent    → TI2V-5B's latent [1, 48, F', H/16, W/16]: empty (text to video), or
                         the start image's latent frame kept by a mask (image to video)
A Wan VAE is read as a Wan VAE (AutoencoderKLWan) by these nodes whichever registered family
loaded it first (a 16-channel Wan VAE is Qwen-Image's too).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from workers.device.thread import on_device_thread
from workers.models.family import LatentFormat
from workers.models.values import Conditioning, Frames, Latent, Vae
from workers.models.wan import LATENT, LATENT_22, TEMPORAL, latent_frames
from workers.runners.base import NodeContext, NodeFailed, runner
from workers.runners.diffusion import checked, expect

FAMILY = "wan"


def _size(params: dict[str, Any], inputs: dict[str, Any],
          fmt: LatentFormat = LATENT) -> tuple[int, int, int]:
    """(width, height, frames), checked against the latents' grid (sides of 16; 32 for
    TI2V-5B's), 1 + 4k frames."""
    width, height, length = (int(inputs.get(k, params[k])) for k in ("width", "height", "length"))
    checked(lambda: fmt.shape(width, height))
    if length < 1 or (length - 1) % TEMPORAL:
        raise NodeFailed(f"length must be 1 + {TEMPORAL}k frames (1, 5, 9, …, 81), got {length}")
    if int(params.get("batch", 1)) != 1:
        raise NodeFailed("one clip per latent: submit several runs (they share forwards)")
    return width, height, length


def _empty(width: int, height: int, length: int, fmt: LatentFormat = LATENT) -> Latent:
    import torch

    shape = (1, fmt.channels, latent_frames(length), height // fmt.downscale,
             width // fmt.downscale)
    return Latent(torch.zeros(shape), empty=True, downscale=fmt.downscale)


@runner("latent/empty-video")
def latent_empty_video(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    return {"latent": _empty(*_size(params, inputs))}


def wan_vae(ctx: NodeContext, vae: Vae) -> Vae:
    """`vae` as Wan's plug-in loads it (cached): the same file, read as AutoencoderKLWan."""
    if vae.family == FAMILY:
        return vae
    from workers.models.catalog import resolve
    from workers.models.wan.loading import is_wan_vae_file, load_vae

    if not is_wan_vae_file(resolve(ctx.models_dir, "vae", vae.name)):
        raise NodeFailed(f"{vae.name} is a {vae.family} VAE, not a video (Wan) VAE")
    load = lambda: load_vae(ctx.models_dir, vae.name, ctx.policy)  # noqa: E731
    return on_device_thread(load) if ctx.policy.device == "cpu" else load()


@runner("vae/decode-video")
def vae_decode_video(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    from workers.models.wan.engine import decode_video

    vae, latent = wan_vae(ctx, expect(inputs, "vae", Vae)), expect(inputs, "latent", Latent)
    if latent.empty:
        raise NodeFailed("an empty latent holds no video: sample it first")
    if latent.samples.shape[1] != vae.module.config.z_dim:
        raise NodeFailed(f"the latent has {latent.samples.shape[1]} channels; {vae.name} decodes "
                         f"{vae.module.config.z_dim}")
    return {"frames": Frames(checked(lambda: on_device_thread(decode_video, vae,
                                                             latent.samples)))}


@runner("frames/image")
def frames_image(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    from PIL import Image

    frames = expect(inputs, "frames", Frames)
    index = int(inputs.get("index", params["index"]))
    if not -frames.count <= index < frames.count:
        raise NodeFailed(f"frame {index} is out of the clip's {frames.count} frames")
    return {"image": Image.fromarray(frames.array[index]).convert("RGB")}


@runner("wan/image-to-video")
def image_to_video(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    """ComfyUI's WanImageToVideo (WanFirstLastFrameToVideo with `end_image`), built as
    WanImageToVideoPipeline builds its condition."""
    from PIL import Image

    from workers.models.wan.engine import i2v_condition

    width, height, length = _size(params, inputs)
    vae = wan_vae(ctx, expect(inputs, "vae", Vae))
    start = expect(inputs, "start_image", Image.Image).convert("RGB")
    end = inputs.get("end_image")
    if end is not None:
        end = expect(inputs, "end_image", Image.Image).convert("RGB")
        if length < 2:
            raise NodeFailed("a first-last-frame clip needs at least 2 frames")
    condition = checked(lambda: on_device_thread(i2v_condition, vae, start, end, width, height,
                                                 length))
    positive = expect(inputs, "positive", Conditioning)
    out: dict[str, Any] = {"positive": _with(positive, condition),
                           "latent": _empty(width, height, length)}
    if inputs.get("negative") is not None:
        out["negative"] = _with(expect(inputs, "negative", Conditioning), condition)
    return out


def _with(conditioning: Conditioning, condition: Any) -> Conditioning:
    if conditioning.encoder.family != FAMILY:
        raise NodeFailed(f"the conditioning was encoded by {conditioning.encoder.name} "
                         f"({conditioning.encoder.family}); wan/image-to-video needs Wan's "
                         "text encoder")
    return replace(conditioning, extra={**conditioning.extra, "condition": condition})


@runner("wan/ti2v-latent")
def ti2v_latent(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    """ComfyUI's Wan22ImageToVideoLatent: TI2V-5B's clip latent, empty without a start image;
    with one, its latent frame (the Wan 2.2 VAE's encode of the image resized to the clip)
    first, kept by the latent's mask while the rest is sampled (WanImageToVideoPipeline with
    `expand_timesteps`)."""
    import torch
    from PIL import Image

    from workers.models.wan.engine import ti2v_start

    width, height, length = _size(params, inputs, LATENT_22)
    vae = wan_vae(ctx, expect(inputs, "vae", Vae))
    if vae.module.config.z_dim != LATENT_22.channels:
        raise NodeFailed(f"{vae.name} has {vae.module.config.z_dim} latent channels: TI2V-5B "
                         f"needs the Wan 2.2 VAE ({LATENT_22.channels})")
    empty = _empty(width, height, length, LATENT_22)
    if inputs.get("start_image") is None:
        return {"latent": empty}
    start = expect(inputs, "start_image", Image.Image).convert("RGB")
    first = checked(lambda: on_device_thread(ti2v_start, vae, start, width, height))
    samples = empty.samples.clone()
    samples[:, :, :1] = first
    mask = torch.ones(1, 1, *samples.shape[2:])
    mask[:, :, 0] = 0
    return {"latent": Latent(samples, downscale=LATENT_22.downscale, mask=mask)}

