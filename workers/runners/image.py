"""Runners for the source nodes and the Pillow image vocabulary (load, crop, save); the other
image operations are in workers/runners/image_ops.py."""

from __future__ import annotations

import io
import time
from typing import Any

import numpy as np
from PIL import Image

from workers.models.values import Mask
from workers.runners.base import NodeContext, NodeFailed, runner


@runner("input/text")
def input_text(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
    return {"text": params["value"]}


@runner("input/int")
def input_int(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
    return {"value": int(params["value"])}


@runner("input/float")
def input_float(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
    return {"value": float(params["value"])}


@runner("input/image")
def input_image(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
    return {"image": _asset_image(params["asset"])}


@runner("image/load")
def image_load(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
    image = _asset_image(params["asset"])
    return {"image": image, "mask": _alpha_mask(image)}


def _alpha_mask(image: Image.Image) -> Mask:
    """ComfyUI's LoadImage mask: 1 where the image is transparent (1 − alpha), else 64×64 zeros."""
    if "A" not in image.getbands():
        return Mask(np.zeros((64, 64), np.float32))
    return Mask(1.0 - np.asarray(image.getchannel("A"), np.float32) / 255.0)


@runner("image/crop")
def image_crop(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
    image: Image.Image = inputs["image"]
    x, y, w, h = params["x"], params["y"], params["width"], params["height"]
    if x + w > image.width or y + h > image.height:
        raise NodeFailed(
            f"crop box {w}x{h} at ({x},{y}) does not fit the {image.width}x{image.height} image"
        )
    return {"image": image.crop((x, y, x + w, y + h))}


@runner("image/save")
def image_save(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
    # .get: a graph stored before `format` existed has none (its takes are PNG)
    ctx.keep_take(inputs["image"], format=params.get("format", "png"),
                  quality=params.get("quality", 90), label=params["label"])
    return {}


@runner("util/delay")
def util_delay(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
    deadline = time.monotonic() + params["seconds"]
    ticks = max(1, int(params["seconds"] / 0.1))
    for tick in range(1, ticks + 1):
        time.sleep(max(0.0, min(0.1, deadline - time.monotonic())))
        ctx.progress(tick, ticks)
    return {"image": inputs["image"]}


def _asset_image(asset_id: str) -> Image.Image:
    from apps.takes.models import Asset
    from apps.takes.storage import BlobMissing, blob_read

    asset = Asset.objects.filter(pk=asset_id).first()
    if asset is None:
        raise NodeFailed(f"asset {asset_id} no longer exists")
    try:
        image = Image.open(io.BytesIO(blob_read(asset.sha256)))
        image.load()
    except BlobMissing as exc:
        raise NodeFailed(str(exc)) from None
    return image.convert("RGBA" if "A" in image.getbands() else "RGB")
