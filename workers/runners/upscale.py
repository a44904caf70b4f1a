"""Runners of the upscale-model nodes (descriptors in apps/graphs/nodes_image.py `UPSCALING`).

ComfyUI's UpscaleModelLoader + ImageUpscaleWithModel (of an image, or of a clip's frames one by
one), on the device policy (role `upscaler`).
Where the farm differs: tiles keep only their own part of the result (each sees `overlap`
pixels of context) where ComfyUI feathers overlapping tiles together; an RGBA image is
upscaled as RGB (ComfyUI's images carry no alpha past LoadImage).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image

from workers.device.thread import on_device_thread
from workers.models.catalog import ModelFileMissing
from workers.models.family import ModelLoadError
from workers.models.values import Frames
from workers.runners.base import NodeContext, NodeFailed, runner
from workers.runners.image_ops import MAX_PIXELS
from workers.runners.video import MAX_CLIP_BYTES


@runner("load/upscale-model")
def load_upscale_model(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]
                       ) -> dict[str, Any]:
    from workers.models.upscale.loading import FOLDER, load_upscale_model

    name = str(params["file"])

    def load() -> Any:
        return load_upscale_model(ctx.models_dir, name, ctx.policy)

    try:  # as the diffusion loaders: on the device thread on CPU, on the slot on a GPU
        model = on_device_thread(load) if ctx.policy.device == "cpu" else load()
    except (ModelFileMissing, ModelLoadError) as exc:
        raise NodeFailed(str(exc)) from exc
    ctx.note_lineage(models={**ctx.lineage.get("models", {}), f"{FOLDER}/{name}": model.sha256})
    return {"upscale_model": model}


@runner("image/upscale-with-model")
def image_upscale_with_model(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]
                             ) -> dict[str, Any]:
    model, image = inputs.get("upscale_model"), inputs.get("image")
    if not isinstance(image, Image.Image):
        raise NodeFailed("inputs 'upscale_model' and 'image' must be an upscale model and an image")
    _check(model, image.width, image.height, 1)
    pixels = np.asarray(image.convert(_mode(model)))
    return {"image": to_image(_upscaled(model, pixels, params, ctx.progress))}


@runner("frames/upscale-with-model")
def frames_upscale_with_model(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]
                              ) -> dict[str, Any]:
    """Each frame as image/upscale-with-model's image, in order; progress and cancel by frame."""
    model, frames = inputs.get("upscale_model"), inputs.get("frames")
    if not isinstance(frames, Frames):
        raise NodeFailed("inputs 'upscale_model' and 'frames' must be an upscale model and frames")
    _check(model, frames.width, frames.height, frames.count)
    out = []
    for i, frame in enumerate(frames.array):
        ctx.check_cancelled()
        pixels = np.asarray(Image.fromarray(frame, "RGB").convert(_mode(model)))
        out.append(np.asarray(to_image(_upscaled(model, pixels, params))))
        ctx.progress(i + 1, frames.count)
    return {"frames": Frames(np.stack(out))}


def _check(model: Any, width: int, height: int, count: int) -> None:
    """An upscale model of RGB or grey images, and a result within the farm's limits."""
    from workers.models.upscale.loading import UpscaleModel

    if not isinstance(model, UpscaleModel):
        raise NodeFailed("input 'upscale_model' must be an upscale model")
    spec = model.spec
    if spec.in_channels not in (1, 3):
        raise NodeFailed(f"{model.name} reads {spec.in_channels}-channel images; the farm "
                         "upscales RGB (or grey) images")
    w, h = width * spec.scale, height * spec.scale
    if w * h > MAX_PIXELS:
        raise NodeFailed(f"{model.name} (x{spec.scale}) would make the {width}x"
                         f"{height} image {w}x{h} pixels, past the farm's limit")
    if count > 1 and count * w * h * 3 > MAX_CLIP_BYTES:
        raise NodeFailed(f"{model.name} (x{spec.scale}) would make {count} frames of {w}x{h}: "
                         f"past the {MAX_CLIP_BYTES >> 30} GiB a clip may hold in memory")


def _mode(model: Any) -> str:
    return "RGB" if model.spec.in_channels == 3 else "L"


def _upscaled(model: Any, pixels: Any, params: dict[str, Any],
              progress: Any = lambda done, total: None) -> Any:
    """[1, C', H·s, W·s] of an [H, W(, C)] uint8 array, in the node's tiles."""
    import torch

    from workers.models.upscale.loading import upscale

    height, width = pixels.shape[:2]
    tensor = torch.from_numpy(pixels.astype(np.float32) / 255.0)
    tensor = tensor.reshape(height, width, -1).permute(2, 0, 1)[None]
    return upscale(model, tensor, tile=int(params["tile"]), overlap=int(params["overlap"]),
                   run=on_device_thread, progress=progress)


def to_image(out: Any) -> Image.Image:
    """[1, C, H, W] in 0..1 (clamped here, as ComfyUI does) → an RGB image, rounded to 8 bits."""
    import torch

    array = out[0].clamp(0.0, 1.0).mul(255.0).round().to(torch.uint8)
    planes = array.permute(1, 2, 0).numpy()
    if planes.shape[-1] == 1:
        return Image.fromarray(planes[..., 0], "L").convert("RGB")
    return Image.fromarray(planes[..., :3], "RGB")
