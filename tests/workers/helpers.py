"""Small helpers shared by the worker tests."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image


def png_bytes(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def pixels(image: Image.Image) -> np.ndarray:
    return np.asarray(image.convert("RGB")).astype(np.int16)


def noise_image(width: int, height: int, seed: int = 0) -> Image.Image:
    rng = np.random.RandomState(seed)
    return Image.fromarray((rng.rand(height, width, 3) * 255).astype("uint8"), "RGB")
