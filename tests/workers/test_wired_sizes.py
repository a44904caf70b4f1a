"""Sizes computed at run time (GetImageSize, math) wired into image ops' params, through the
real executor: the value that arrives is used, and checked against the param's limits."""

from __future__ import annotations

import io
from typing import Any

import pytest
from PIL import Image

from apps.takes.storage import blob_read
from tests.workers.helpers import noise_image, pixels
from tests.workers.vocab_helpers import asset_of, render, wire

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _blobs(settings: Any, tmp_path: Any) -> None:
    settings.INLINE_BLOB_DIR = tmp_path / "blobs"


def _graph(expression: str) -> dict[str, Any]:
    """load → size → crop (width from `expression` of the width, height the image's) → save."""
    return {
        "src": {"type": "image/load", "params": {"asset": asset_of(noise_image(64, 48, seed=9))}},
        "size": {"type": "image/size", "inputs": {"image": wire("src", "image")}},
        "half": {"type": "math/expression", "params": {"expression": expression},
                 "inputs": {"a": wire("size", "width")}},
        "crop": {"type": "image/crop", "params": {"x": 4, "width": 1, "height": 1},
                 "inputs": {"image": wire("src", "image"), "width": wire("half", "int"),
                            "height": wire("size", "height")}},
        "out": {"type": "image/save", "inputs": {"image": wire("crop", "image")}},
    }


def test_a_crop_sized_by_image_size_and_math_at_run_time():
    outcome, run = render(_graph("a / 2"), "out")
    assert outcome.status == "succeeded", outcome.error
    saved = Image.open(io.BytesIO(blob_read(run.takes.get().sha256)))
    assert saved.size == (32, 48)
    expected = noise_image(64, 48, seed=9).crop((4, 0, 36, 48))
    assert pixels(saved).tolist() == pixels(expected).tolist()


def test_a_computed_size_outside_the_param_s_range_fails_naming_the_node_and_input():
    outcome, _ = render(_graph("a - 64"), "out")  # a width of 0
    error = outcome.error or {}
    assert outcome.status == "failed" and error["nodeId"] == "crop"
    assert error["code"] == "param_range" and "(from input 'width')" in error["message"]
