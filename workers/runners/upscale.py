"""Runners of the upscale-model nodes (descriptors in apps/graphs/nodes_image.py `UPSCALING`).

ComfyUI's UpscaleModelLoader + ImageUpscaleWithModel, on the device policy (role `upscaler`).
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
from workers.runners.base import NodeContext, NodeFailed, runner
from workers.runners.image_ops import MAX_PIXELS


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
    import torch

    from workers.models.upscale.loading import UpscaleModel, upscale

    model, image = inputs.get("upscale_model"), inputs.get("image")
    if not isinstance(model, UpscaleModel) or not isinstance(image, Image.Image):
        raise NodeFailed("inputs 'upscale_model' and 'image' must be an upscale model and an image")
    spec = model.spec
    if spec.in_channels not in (1, 3):
        raise NodeFailed(f"{model.name} reads {spec.in_channels}-channel images; the farm "
                         "upscales RGB (or grey) images")
    width, height = image.width * spec.scale, image.height * spec.scale
    if width * height > MAX_PIXELS:
        raise NodeFailed(f"{model.name} (x{spec.scale}) would make the {image.width}x"
                         f"{image.height} image {width}x{height} pixels, past the farm's limit")
    mode = "RGB" if spec.in_channels == 3 else "L"
    pixels = torch.from_numpy(np.asarray(image.convert(mode), np.float32) / 255.0)
    pixels = pixels.reshape(image.height, image.width, -1).permute(2, 0, 1)[None]
    out = upscale(model, pixels, tile=int(params["tile"]), overlap=int(params["overlap"]),
                  run=on_device_thread, progress=ctx.progress)
    return {"image": to_image(out)}


def to_image(out: Any) -> Image.Image:
    """[1, C, H, W] in 0..1 (clamped here, as ComfyUI does) → an RGB image, rounded to 8 bits."""
    import torch

    array = out[0].clamp(0.0, 1.0).mul(255.0).round().to(torch.uint8)
    planes = array.permute(1, 2, 0).numpy()
    if planes.shape[-1] == 1:
        return Image.fromarray(planes[..., 0], "L").convert("RGB")
    return Image.fromarray(planes[..., :3], "RGB")
