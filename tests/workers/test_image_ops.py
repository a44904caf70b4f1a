"""The image and mask operations, called as the executor calls them, against ComfyUI's arithmetic
(sizes, centre crop, composite bounds, outpaint feathering) written out here."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from PIL import Image

from tests.workers.helpers import noise_image, pixels
from workers.models.values import Mask
from workers.runners import image_ops  # noqa: F401  (registers the runners)
from workers.runners.base import RUNNERS, NodeFailed


def run(node_type: str, params: dict[str, Any] | None = None, **inputs: Any) -> dict[str, Any]:
    return RUNNERS[node_type](None, params or {}, inputs)  # type: ignore[arg-type]


IMAGE = noise_image(64, 48, seed=3)
LANCZOS = Image.Resampling.LANCZOS


@pytest.mark.parametrize(("factor", "size"), [(1.5, (96, 72)), (0.33, (21, 16)), (2, (128, 96))])
def test_scale_by_rounds_each_side_as_comfyui(factor, size):
    out = run("image/scale-by", {"scale_by": factor, "method": "bilinear"}, image=IMAGE)["image"]
    assert out.size == size
    assert pixels(out).tolist() == pixels(IMAGE.resize(size, Image.Resampling.BILINEAR)).tolist()


@pytest.mark.parametrize(("steps", "size"), [(1, (118, 89)), (8, (120, 88))])
def test_scale_to_total_pixels_keeps_the_aspect_and_rounds_to_steps(steps, size):
    out = run("image/scale-to-pixels", {"megapixels": 0.01, "resolution_steps": steps,
                                        "method": "lanczos"}, image=IMAGE)["image"]
    assert out.size == size


@pytest.mark.parametrize(("size", "expected", "cut"), [
    ((64, 48), (1184, 880), (0, 0, 64, 48)), ((40, 64), (800, 1328), (1, 0, 39, 64)),
    ((30, 30), (1024, 1024), (0, 0, 30, 30)), ((300, 20), (1568, 672), (127, 0, 173, 20)),
])
def test_scale_to_kontext_picks_the_preferred_resolution_nearest_the_aspect(size, expected, cut):
    """ComfyUI's FluxKontextImageScale: the centre cut to the resolution's aspect, then scaled
    (Lanczos); stretch scales the whole image (FluxKontextPipeline)."""
    image = IMAGE.resize(size)
    cropped = run("image/scale-to-kontext", {"method": "lanczos", "fit": "crop"},
                  image=image)["image"]
    assert pixels(cropped).tolist() == pixels(image.crop(cut).resize(expected, LANCZOS)).tolist()
    stretched = run("image/scale-to-kontext", {"method": "lanczos", "fit": "stretch"},
                    image=image)["image"]
    assert pixels(stretched).tolist() == pixels(image.resize(expected, LANCZOS)).tolist()


@pytest.mark.parametrize(("side", "size", "expected"), [
    ("longer", 32, (32, 24)), ("shorter", 32, (43, 32)), ("width", 100, (100, 75)),
    ("height", 100, (133, 100)),
])
def test_scale_by_one_side_keeps_the_aspect(side, size, expected):
    out = run("image/scale-side", {"side": side, "size": size, "method": "nearest"},
              image=IMAGE)["image"]
    assert out.size == expected


def test_resize_with_crop_cuts_the_centre_as_comfyui_before_scaling():
    out = run("image/resize", {"width": 32, "height": 32, "method": "bicubic", "fit": "crop"},
              image=IMAGE)["image"]
    # common_upscale(crop="center"): 64x48 → aspect 1 cuts x = round((64 - 48) / 2) = 8
    expected = IMAGE.crop((8, 0, 56, 48)).resize((32, 32), Image.Resampling.BICUBIC)
    assert out.size == (32, 32) and pixels(out).tolist() == pixels(expected).tolist()


def test_resize_with_pad_fits_inside_and_pads_the_rest():
    out = run("image/resize", {"width": 64, "height": 64, "method": "lanczos", "fit": "pad",
                               "pad_color": "white"}, image=IMAGE)["image"]
    p = pixels(out)
    assert out.size == (64, 64)
    assert (p[:8] == 255).all() and (p[56:] == 255).all()  # (64 - 48) // 2 rows above and below
    assert p[8:56].tolist() == pixels(IMAGE).tolist()


@pytest.mark.parametrize(("fit", "expected"), [
    ("stretch", IMAGE.resize((30, 20), Image.Resampling.BILINEAR)),
    # crop: aspect 1.5 from 64x48 (1.33) cuts y = round((48 - 48 · (1.33 / 1.5)) / 2) = 3
    ("crop", IMAGE.crop((0, 3, 64, 45)).resize((30, 20), Image.Resampling.BILINEAR)),
])
def test_resize_to_match_takes_the_size_of_an_image_or_a_mask(fit, expected):
    for match in (Image.new("RGB", (30, 20)), Mask(np.zeros((20, 30), np.float32))):
        out = run("image/resize-to-match", {"method": "bilinear", "fit": fit}, image=IMAGE,
                  match=match)["image"]
        assert out.size == (30, 20) and pixels(out).tolist() == pixels(expected).tolist()


def _comfy_multiple_cover(width: int, height: int, multiple: int) -> tuple[int, int, int, int]:
    """ComfyUI's scale_to_multiple_cover arithmetic: (scaled w, scaled h, x0, y0)."""
    target_w, target_h = (width // multiple) * multiple, (height // multiple) * multiple
    s_w, s_h = target_w / width, target_h / height
    if s_w >= s_h:
        scaled_w, scaled_h = target_w, math.ceil(height * s_w)
        scaled_h = max(scaled_h, target_h)
    else:
        scaled_h, scaled_w = target_h, math.ceil(width * s_h)
        scaled_w = max(scaled_w, target_w)
    return scaled_w, scaled_h, (scaled_w - target_w) // 2, (scaled_h - target_h) // 2


@pytest.mark.parametrize(("size", "multiple", "result"), [
    ((64, 48), 20, (60, 40)), ((48, 64), 20, (40, 60)), ((64, 48), 7, (63, 42)),
])
def test_scale_to_multiple_covers_the_grid_size_and_cuts_the_centre_as_comfyui(size, multiple,
                                                                                result):
    width, height = size
    image = noise_image(width, height, seed=4)
    out = run("image/scale-to-multiple", {"multiple": multiple, "method": "bicubic"},
              image=image)["image"]
    scaled_w, scaled_h, x0, y0 = _comfy_multiple_cover(width, height, multiple)
    expected = image.resize((scaled_w, scaled_h), Image.Resampling.BICUBIC).crop(
        (x0, y0, x0 + result[0], y0 + result[1]))
    assert out.size == result and pixels(out).tolist() == pixels(expected).tolist()


@pytest.mark.parametrize("multiple", [1, 16, 100])
def test_scale_to_multiple_keeps_an_image_on_the_grid_or_smaller_than_a_step(multiple):
    image = noise_image(64, 48, seed=4)
    assert run("image/scale-to-multiple", {"multiple": multiple, "method": "nearest"},
               image=image)["image"] is image


def test_a_result_past_the_pixel_limit_is_refused():
    with pytest.raises(NodeFailed, match="pixels"):
        run("image/scale-by", {"scale_by": 0.01, "method": "nearest"},
            image=Image.new("RGB", (40, 40)))


def test_invert_inverts_colour_and_keeps_alpha():
    rgba = Image.new("RGBA", (2, 1), (10, 20, 30, 77))
    out = run("image/invert", image=rgba)["image"]
    assert out.mode == "RGBA" and out.getpixel((0, 0)) == (245, 235, 225, 77)


def test_composite_pastes_the_source_through_the_mask_cut_to_the_destination():
    destination = Image.new("RGB", (8, 8), (0, 0, 0))
    source = Image.new("RGB", (4, 4), (200, 100, 50))
    mask = Mask(np.full((2, 2), 0.5, np.float32))  # stretched to the source's 4x4
    out = pixels(run("image/composite", {"x": 6, "y": 2, "resize_source": False},
                     destination=destination, source=source, mask=mask)["image"])
    assert (out[2:6, 6:8] == [100, 50, 25]).all()  # only 2 columns of the source fit
    assert (out[:2] == 0).all() and (out[6:] == 0).all() and (out[:, :6] == 0).all()
    full = pixels(run("image/composite", {"x": 0, "y": 0, "resize_source": True},
                      destination=destination, source=source)["image"])
    assert (full == [200, 100, 50]).all()


def _comfy_outpaint_mask(h: int, w: int, top: int, bottom: int, left: int, right: int,
                         feathering: int) -> np.ndarray:
    """ComfyUI's ImagePadForOutpaint mask, its own loops."""
    mask = np.ones((h + top + bottom, w + left + right), np.float32)
    t = np.zeros((h, w), np.float32)
    if feathering > 0 and feathering * 2 < h and feathering * 2 < w:
        for i in range(h):
            for j in range(w):
                d = min(i if top != 0 else h, h - i if bottom != 0 else h,
                        j if left != 0 else w, w - j if right != 0 else w)
                if d < feathering:
                    t[i, j] = ((feathering - d) / feathering) ** 2
    mask[top:top + h, left:left + w] = t
    return mask


@pytest.mark.parametrize("pads", [(0, 0, 16, 0, 6), (8, 8, 0, 24, 5), (0, 16, 8, 8, 0)])
def test_pad_for_outpaint_grows_grey_and_feathers_the_mask_as_comfyui(pads):
    top, bottom, left, right, feathering = pads
    out = run("image/pad-outpaint", {"left": left, "top": top, "right": right,
                                     "bottom": bottom, "feathering": feathering}, image=IMAGE)
    image, mask = out["image"], out["mask"]
    assert image.size == (64 + left + right, 48 + top + bottom)
    assert pixels(image)[top:top + 48, left:left + 64].tolist() == pixels(IMAGE).tolist()
    if left:
        assert (pixels(image)[:, 0] == 128).all()
    expected = _comfy_outpaint_mask(48, 64, top, bottom, left, right, feathering)
    assert np.allclose(mask.values, expected, atol=1e-6)


def test_a_mask_from_a_channel_and_back_to_an_image():
    image = Image.new("RGBA", (3, 2), (255, 128, 0, 64))
    assert np.allclose(run("mask/from-image", {"channel": "green"}, image=image)["mask"].values,
                       128 / 255)
    alpha = run("mask/from-image", {"channel": "alpha"}, image=image)["mask"]
    assert pixels(run("mask/to-image", mask=alpha)["image"]).tolist() == [[[64] * 3] * 3] * 2
    with pytest.raises(NodeFailed, match="no alpha"):
        run("mask/from-image", {"channel": "alpha"}, image=image.convert("RGB"))


def test_image_size_gives_width_height_and_a_batch_of_one():
    from workers.runners import logic  # noqa: F401

    assert RUNNERS["image/size"](None, {}, {"image": IMAGE}) == {  # type: ignore[arg-type]
        "width": 64, "height": 48, "batch_size": 1}
