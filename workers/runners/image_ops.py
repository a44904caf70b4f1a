"""Runners for the image and mask operations (descriptors in apps/graphs/nodes_image.py).

Sizes follow ComfyUI's arithmetic to the pixel (its `round`s, its centre crop, its outpaint
feathering). Where the farm differs: resampling is Pillow's filters (ComfyUI interpolates with
torch, lanczos through Pillow too; `area` is imported as bilinear), pixels are 8-bit and
rounded (ComfyUI truncates when it saves), and an RGBA image keeps its alpha through invert
(ComfyUI's images have no alpha past LoadImage).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from PIL import Image

from workers.models.values import Mask
from workers.runners.base import NodeContext, NodeFailed, runner

RESAMPLE = {
    "lanczos": Image.Resampling.LANCZOS,
    "bicubic": Image.Resampling.BICUBIC,
    "bilinear": Image.Resampling.BILINEAR,
    "nearest": Image.Resampling.NEAREST,
}
PAD_COLORS = {"black": 0, "white": 255, "gray": 128}
MAX_PIXELS = 8192 * 8192  # a result past this is refused: the node would exhaust memory


def resized(image: Image.Image, width: int, height: int, method: str) -> Image.Image:
    if width < 1 or height < 1 or width * height > MAX_PIXELS:
        raise NodeFailed(f"the result would be {width}x{height} pixels")
    if (width, height) == image.size:
        return image
    return image.resize((width, height), RESAMPLE[method])


@runner("image/resize")
def image_resize(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
    image: Image.Image = inputs["image"]
    width, height, method = params["width"], params["height"], params["method"]
    fit = params.get("fit", "stretch")  # .get: graphs stored before `fit` existed
    if fit == "crop":
        image = image.crop(centre_crop_box(image.width, image.height, width / height))
    elif fit == "pad":
        return {"image": _fit_and_pad(image, width, height, method,
                                      params.get("pad_color", "black"))}
    return {"image": resized(image, width, height, method)}


def centre_crop_box(old_w: int, old_h: int, new_aspect: float) -> tuple[int, int, int, int]:
    """ComfyUI's `common_upscale(crop="center")`: cut the sides (or top and bottom) so the
    image has the target's aspect, before scaling."""
    old_aspect = old_w / old_h
    x = y = 0
    if old_aspect > new_aspect:
        x = round((old_w - old_w * (new_aspect / old_aspect)) / 2)
    elif old_aspect < new_aspect:
        y = round((old_h - old_h * (old_aspect / new_aspect)) / 2)
    return x, y, old_w - x, old_h - y


def _fit_and_pad(image: Image.Image, width: int, height: int, method: str, color: str
                 ) -> Image.Image:
    """ComfyUI's ResizeAndPadImage: scale to fit inside, centre, pad the rest."""
    scale = min(width / image.width, height / image.height)
    inner = resized(image, max(1, int(image.width * scale)), max(1, int(image.height * scale)),
                     method)
    canvas = Image.new(image.mode, (width, height), (PAD_COLORS[color],) * len(image.getbands()))
    canvas.paste(inner, ((width - inner.width) // 2, (height - inner.height) // 2))
    return canvas


@runner("image/scale-by")
def image_scale_by(
    ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]
) -> dict[str, Any]:
    image: Image.Image = inputs["image"]
    factor = params["scale_by"]
    return {"image": resized(image, round(image.width * factor), round(image.height * factor),
                              params["method"])}


@runner("image/scale-to-pixels")
def image_scale_to_pixels(
    ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]
) -> dict[str, Any]:
    image: Image.Image = inputs["image"]
    steps = params["resolution_steps"]
    scale = math.sqrt(params["megapixels"] * 1024 * 1024 / (image.width * image.height))
    width = round(image.width * scale / steps) * steps
    height = round(image.height * scale / steps) * steps
    return {"image": resized(image, width, height, params["method"])}


@runner("image/scale-to-kontext")
def image_scale_to_kontext(
    ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]
) -> dict[str, Any]:
    """To the preferred FLUX.1 Kontext resolution nearest the image's aspect, its centre cut
    first when `fit` is crop (ComfyUI's FluxKontextImageScale)."""
    from workers.models.flux1 import kontext_size

    image: Image.Image = inputs["image"]
    width, height = kontext_size(image.width, image.height)
    if params.get("fit", "crop") == "crop":
        image = image.crop(centre_crop_box(image.width, image.height, width / height))
    return {"image": resized(image, width, height, params["method"])}


@runner("image/scale-side")
def image_scale_side(
    ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]
) -> dict[str, Any]:
    image: Image.Image = inputs["image"]
    w, h, size, side = image.width, image.height, params["size"], params["side"]
    if side == "longer":
        side = "width" if w >= h else "height"
    elif side == "shorter":
        side = "width" if w <= h else "height"
    if side == "width":  # ComfyUI's ImageScale with height 0
        width, height = size, max(1, round(h * size / w))
    else:
        width, height = max(1, round(w * size / h)), size
    return {"image": resized(image, width, height, params["method"])}


@runner("image/resize-to-match")
def image_resize_to_match(
    ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]
) -> dict[str, Any]:
    """ComfyUI's `scale_match_size`: common_upscale to the match's size, centre-cut first
    when `fit` is crop."""
    image: Image.Image = inputs["image"]
    match = inputs["match"]  # an image or a Mask: both have width and height
    width, height = int(match.width), int(match.height)
    if params.get("fit", "crop") == "crop":
        image = image.crop(centre_crop_box(image.width, image.height, width / height))
    return {"image": resized(image, width, height, params["method"])}


@runner("image/scale-to-multiple")
def image_scale_to_multiple(
    ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]
) -> dict[str, Any]:
    """ComfyUI's `scale_to_multiple_cover`: the sides rounded down to the multiple; scaled
    (aspect kept) until both cover that size, then its centre cut."""
    image: Image.Image = inputs["image"]
    multiple, (width, height) = int(params["multiple"]), image.size
    target_w, target_h = width // multiple * multiple, height // multiple * multiple
    if multiple <= 1 or not target_w or not target_h or (target_w, target_h) == (width, height):
        return {"image": image}
    s_w, s_h = target_w / width, target_h / height
    if s_w >= s_h:
        scaled_w, scaled_h = target_w, max(target_h, math.ceil(height * s_w))
    else:
        scaled_w, scaled_h = max(target_w, math.ceil(width * s_h)), target_h
    scaled = resized(image, scaled_w, scaled_h, params["method"])
    x0, y0 = (scaled_w - target_w) // 2, (scaled_h - target_h) // 2
    return {"image": scaled.crop((x0, y0, x0 + target_w, y0 + target_h))}


@runner("image/empty")
def image_empty(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
    color = int(params["color"])
    rgb = ((color >> 16) & 0xFF, (color >> 8) & 0xFF, color & 0xFF)
    return {"image": Image.new("RGB", (int(params["width"]), int(params["height"])), rgb)}


@runner("image/invert")
def image_invert(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
    image: Image.Image = inputs["image"]
    pixels = np.asarray(image).copy()
    colours = 3 if image.mode in ("RGB", "RGBA") else pixels.shape[-1] if pixels.ndim == 3 else 1
    if pixels.ndim == 2:
        pixels = 255 - pixels
    else:
        pixels[..., :colours] = 255 - pixels[..., :colours]
    return {"image": Image.fromarray(pixels, image.mode)}


@runner("image/composite")
def image_composite(
    ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]
) -> dict[str, Any]:
    """ComfyUI's `composite` at multiplier 1: the source at (x, y), cut to what overlaps the
    destination, blended through the mask (stretched bilinearly to the source's size)."""
    destination = _float_rgb(inputs["destination"])
    source_image: Image.Image = inputs["source"]
    dh, dw = destination.shape[:2]
    if params["resize_source"]:
        source_image = source_image.resize((dw, dh), Image.Resampling.BILINEAR)
    source = _float_rgb(source_image)
    sh, sw = source.shape[:2]
    mask = _mask_resized(inputs["mask"], sw, sh) if "mask" in inputs else np.ones((sh, sw),
                                                                                  np.float32)
    x, y = min(params["x"], dw), min(params["y"], dh)
    vw, vh = min(sw, dw - x), min(sh, dh - y)
    m = mask[:vh, :vw, None]
    region = destination[y:y + vh, x:x + vw]
    destination[y:y + vh, x:x + vw] = m * source[:vh, :vw] + (1.0 - m) * region
    return {"image": _from_float(destination)}


@runner("image/pad-outpaint")
def image_pad_outpaint(
    ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]
) -> dict[str, Any]:
    """ComfyUI's ImagePadForOutpaint: the new border mid-grey, a mask of 1 over it and, inside
    the old image, (f − d)² / f² within `feathering` pixels of a padded edge."""
    image = _float_rgb(inputs["image"])
    left, top, right, bottom = (params[k] for k in ("left", "top", "right", "bottom"))
    feathering = params["feathering"]
    h, w = image.shape[:2]
    canvas = np.full((h + top + bottom, w + left + right, 3), 0.5, np.float32)
    if canvas.shape[0] * canvas.shape[1] > MAX_PIXELS:
        raise NodeFailed(f"the padded image would be {canvas.shape[1]}x{canvas.shape[0]}")
    canvas[top:top + h, left:left + w] = image
    mask = np.ones(canvas.shape[:2], np.float32)
    mask[top:top + h, left:left + w] = _feather(h, w, (top, bottom, left, right), feathering)
    return {"image": _from_float(canvas), "mask": Mask(mask)}


def _feather(h: int, w: int, pads: tuple[int, int, int, int], feathering: int) -> np.ndarray:
    inner = np.zeros((h, w), np.float32)
    if not (feathering > 0 and feathering * 2 < h and feathering * 2 < w):
        return inner
    top, bottom, left, right = pads
    i = np.arange(h, dtype=np.float32)[:, None]
    j = np.arange(w, dtype=np.float32)[None, :]
    d = np.minimum(np.minimum(i if top else np.full_like(i, h), h - i if bottom else np.full_like(i, h)),
                   np.minimum(j if left else np.full_like(j, w), w - j if right else np.full_like(j, w)))
    v = (feathering - d) / feathering
    return np.where(d < feathering, v * v, 0.0).astype(np.float32)


@runner("mask/from-image")
def mask_from_image(
    ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]
) -> dict[str, Any]:
    image: Image.Image = inputs["image"]
    channel = params["channel"]
    if channel == "alpha" and "A" not in image.getbands():
        raise NodeFailed("the image has no alpha channel")
    band = image.convert("RGBA" if channel == "alpha" else "RGB").getchannel(
        {"red": "R", "green": "G", "blue": "B", "alpha": "A"}[channel])
    return {"mask": Mask(np.asarray(band, np.float32) / 255.0)}


@runner("mask/to-image")
def mask_to_image(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
    grey = np.rint(np.clip(inputs["mask"].values, 0.0, 1.0) * 255.0).astype(np.uint8)
    return {"image": Image.fromarray(grey, "L").convert("RGB")}


def _float_rgb(image: Image.Image) -> np.ndarray:
    """[H, W, 3] float32 in 0..1 (alpha dropped: ComfyUI composites colour only)."""
    return np.asarray(image.convert("RGB"), np.float32) / 255.0


def _from_float(pixels: np.ndarray) -> Image.Image:
    return Image.fromarray(np.rint(np.clip(pixels, 0.0, 1.0) * 255.0).astype(np.uint8), "RGB")


def _mask_resized(mask: Mask, width: int, height: int) -> np.ndarray:
    if (mask.width, mask.height) == (width, height):
        return np.asarray(mask.values, np.float32)
    plane = Image.fromarray(np.asarray(mask.values, np.float32), "F")
    return np.asarray(plane.resize((width, height), Image.Resampling.BILINEAR), np.float32)
