"""image/save's formats (ComfyUI's SaveImageAdvanced) and image/load's mask: a take's bytes are
PNG, WebP or JPEG at the node's quality, and its media type says which (served as its content
type: tests/apps/importer/test_import_e2e.py reads a WebP take over /v1)."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from PIL import Image

from apps.takes.services import asset_create
from tests.workers.helpers import noise_image, png_bytes
from tests.workers.vocab_helpers import render, wire

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _blobs(settings: Any, tmp_path: Any) -> None:
    settings.INLINE_BLOB_DIR = tmp_path / "blobs"


def _saved(fmt: str, quality: int = 90) -> Any:
    owner, _ = get_user_model().objects.get_or_create(username="vocab-owner")
    asset, _ = asset_create(owner=owner, data=png_bytes(noise_image(64, 48, seed=5)))
    nodes = {
        "src": {"type": "image/load", "params": {"asset": str(asset.pk)}},
        "inv": {"type": "image/invert", "inputs": {"image": wire("src", "image")}},
        "out": {"type": "image/save", "params": {"format": fmt, "quality": quality},
                "inputs": {"image": wire("inv", "image")}},
    }
    outcome, run = render(nodes, "out")
    assert outcome.status == "succeeded", outcome.error
    [take] = run.takes.all()
    return take


@pytest.mark.parametrize(("fmt", "media_type", "pillow"), [
    ("png", "image/png", "PNG"), ("webp", "image/webp", "WEBP"), ("jpeg", "image/jpeg", "JPEG"),
])
def test_a_take_is_stored_in_the_format_it_was_saved_as(fmt, media_type, pillow):
    from apps.takes.storage import blob_read

    take = _saved(fmt)
    data = blob_read(take.sha256)
    image = Image.open(io.BytesIO(data))
    assert take.media_type == media_type and image.format == pillow
    assert (take.width, take.height) == image.size == (64, 48)
    assert take.lineage["nodeType"] == "image/save"


def test_a_lower_quality_makes_smaller_lossy_bytes():
    from apps.takes.storage import blob_read

    assert len(blob_read(_saved("jpeg", 30).sha256)) < len(blob_read(_saved("jpeg", 95).sha256))
    assert len(blob_read(_saved("webp", 30).sha256)) < len(blob_read(_saved("webp", 95).sha256))



def test_a_loaded_image_s_mask_is_one_minus_its_alpha_as_comfyui_s_load_image():
    from apps.takes.storage import blob_read

    owner, _ = get_user_model().objects.get_or_create(username="vocab-owner")
    rgba = Image.new("RGBA", (8, 4), (10, 20, 30, 255))
    rgba.paste((10, 20, 30, 55), (0, 0, 4, 4))  # the left half mostly transparent
    asset, _ = asset_create(owner=owner, data=png_bytes(rgba))
    nodes = {
        "src": {"type": "image/load", "params": {"asset": str(asset.pk)}},
        "grey": {"type": "mask/to-image", "inputs": {"mask": wire("src", "mask")}},
        "out": {"type": "image/save", "inputs": {"image": wire("grey", "image")}},
    }
    outcome, run = render(nodes, "out")
    assert outcome.status == "succeeded", outcome.error
    saved = Image.open(io.BytesIO(blob_read(run.takes.get().sha256))).convert("L")
    assert saved.getpixel((0, 0)) == 200 and saved.getpixel((7, 3)) == 0  # 255 − 55, 255 − 255
