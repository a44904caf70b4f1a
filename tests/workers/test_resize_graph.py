"""ResizeImageMaskNode's match-size and scale-to-multiple modes, imported from ComfyUI's API
format and rendered through the real executor on the real database."""

from __future__ import annotations

import io
from typing import Any

import pytest
from PIL import Image

from apps.importer.services import comfy_import
from tests.workers.helpers import noise_image
from tests.workers.vocab_helpers import asset_of, render

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _blobs(settings: Any, tmp_path: Any) -> None:
    settings.INLINE_BLOB_DIR = tmp_path / "blobs"


def _rendered_size(resize: dict[str, Any]) -> tuple[int, int]:
    from apps.takes.storage import blob_read

    asset = asset_of(noise_image(100, 70, seed=2))
    prompt = {
        "1": {"class_type": "LoadImage", "inputs": {"image": "plate.png"}},
        "2": {"class_type": "ResizeImageMaskNode", "inputs": {
            "input": ["1", 0], "scale_method": "bicubic", **resize}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "r"}},
    }
    imported = comfy_import(workflow=prompt, catalog={}, resolve_asset=lambda name: asset)
    assert imported.report.unmapped == [] and imported.report.warnings == []
    outcome, run = render(imported.graph.model_dump()["nodes"], imported.target)
    assert outcome.status == "succeeded", outcome.error
    [take] = run.takes.all()
    return Image.open(io.BytesIO(blob_read(take.sha256))).size


def test_match_size_takes_the_size_of_a_mask_and_multiple_rounds_down_to_the_grid():
    # LoadImage's mask of an image without alpha is ComfyUI's 64×64 zeros: matched, cropped
    assert _rendered_size({"resize_type": "match size", "resize_type.match": ["1", 1],
                           "resize_type.crop": "center"}) == (64, 64)
    assert _rendered_size({"resize_type": "scale to multiple",
                           "resize_type.multiple": 32}) == (96, 64)
