"""A take's bytes in the lossy formats `image/save` offers (PNG is workers/png.py's).

WebP and JPEG through Pillow at the node's `quality`; the generation parameters travel as XMP
(WebP) or a JPEG comment, as PNG carries them in its `inline-farm` text chunk. JPEG has no
alpha: an RGBA image is flattened onto black first (ComfyUI's images have no alpha either).
The bytes depend only on the pixels, the quality and the text, so a take's sha256 is the same
on every worker with the same Pillow.
"""

from __future__ import annotations

import io

from PIL import Image

MEDIA_TYPES = {"webp": "image/webp", "jpeg": "image/jpeg"}


def take_encode(image: Image.Image, format: str, quality: int, text: str) -> tuple[bytes, str]:
    """(bytes, content type) of `image` as `format` ("webp" or "jpeg")."""
    out = io.BytesIO()
    if format == "jpeg":
        if image.mode not in ("RGB", "L"):
            image = image.convert("RGB")
        image.save(out, format="JPEG", quality=quality, comment=text.encode())
    elif format == "webp":
        xmp = f'<x:xmpmeta xmlns:x="adobe:ns:meta/"><inline-farm>{_escape(text)}</inline-farm>' \
              "</x:xmpmeta>"
        image.save(out, format="WEBP", quality=quality, method=4, xmp=xmp.encode())
    else:
        raise ValueError(f"no encoder for take format {format!r}")
    return out.getvalue(), MEDIA_TYPES[format]


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
