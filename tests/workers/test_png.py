"""workers/png.py: the takes' PNG encoder decodes to the same pixels and text, in any reader."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image, PngImagePlugin

from workers import png
from workers.png import png_encode


def _chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    """(type, data) of every chunk, each chunk's CRC checked."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    out, at = [], 8
    while at < len(data):
        (length,) = struct.unpack(">I", data[at:at + 4])
        kind, body = data[at + 4:at + 8], data[at + 8:at + 8 + length]
        (crc,) = struct.unpack(">I", data[at + 8 + length:at + 12 + length])
        assert crc == zlib.crc32(kind + body), kind
        out.append((kind, body))
        at += 12 + length
    return out


def _opened(data: bytes) -> PngImagePlugin.PngImageFile:
    image = Image.open(io.BytesIO(data))
    assert isinstance(image, PngImagePlugin.PngImageFile)
    image.load()
    return image


def _image(mode: str, width: int, height: int, seed: int = 0) -> Image.Image:
    bands = len(mode)
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, bands), dtype=np.uint8)
    return Image.fromarray(pixels[..., 0] if bands == 1 else pixels, mode)


@pytest.mark.parametrize("mode", ["L", "LA", "RGB", "RGBA"])
@pytest.mark.parametrize("size", [(1, 1), (37, 1), (64, 48), (700, 500)])
def test_it_decodes_to_the_same_pixels_and_text(mode: str, size: tuple[int, int]):
    image = _image(mode, *size)
    data = png_encode(image, {"inline-farm": '{"seed": 7}'})
    back = _opened(data)
    assert back.mode == mode and back.size == size
    assert np.array_equal(np.asarray(back), np.asarray(image))
    assert back.text == {"inline-farm": '{"seed": 7}'}
    kinds = [kind for kind, _ in _chunks(data)]
    assert kinds == [b"IHDR", b"tEXt", b"IDAT", b"IEND"]
    # the zlib stream is whole (its Adler-32 too, which Pillow does not check)
    idat = next(body for kind, body in _chunks(data) if kind == b"IDAT")
    assert len(zlib.decompress(idat)) == size[1] * (1 + size[0] * len(mode))


def test_a_large_image_is_deflated_in_pieces_that_join_into_one_stream():
    image = _image("RGB", 700, 500)  # 1.05 MB of scanlines: several pieces
    assert -(-(500 * (1 + 700 * 3)) // png.PIECE_BYTES) > 1
    data = png_encode(image)
    idat = next(body for kind, body in _chunks(data) if kind == b"IDAT")
    decompressor = zlib.decompressobj()
    assert len(decompressor.decompress(idat)) == 500 * (1 + 700 * 3)
    assert decompressor.eof and not decompressor.unused_data


def test_the_bytes_depend_only_on_the_pixels_and_text(monkeypatch: pytest.MonkeyPatch):
    image = _image("RGB", 700, 500, seed=3)
    first = png_encode(image, {"k": "v"})
    assert png_encode(image.copy(), {"k": "v"}) == first
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setattr(png, "_pool", ThreadPoolExecutor(1))  # another machine's thread count
    assert png_encode(image, {"k": "v"}) == first
    assert png_encode(_image("RGB", 700, 500, seed=4), {"k": "v"}) != first


@pytest.mark.parametrize("mode", ["P", "I;16", "1"])
def test_other_modes_are_left_to_pillow(mode: str):
    image = Image.new(mode, (20, 10))
    data = png_encode(image, {"inline-farm": "{}"})
    assert data == png._pillow(image, {"inline-farm": "{}"})
    assert _opened(data).text == {"inline-farm": "{}"}


def test_text_that_is_not_latin_1_is_written_by_pillow_as_itxt():
    image = _image("RGB", 8, 8)
    data = png_encode(image, {"inline-farm": '{"prompt": "灯台"}'})
    back = _opened(data)
    assert back.text == {"inline-farm": '{"prompt": "灯台"}'}
    assert np.array_equal(np.asarray(back), np.asarray(image))


def test_an_images_colour_profile_and_transparent_colour_are_kept_as_pillow_keeps_them():
    from PIL import ImageCms

    profile = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    with_profile = _image("RGB", 16, 8)
    with_profile.info["icc_profile"] = profile
    assert _opened(png_encode(with_profile)).info["icc_profile"] == profile
    keyed = _image("RGB", 16, 8)
    keyed.info["transparency"] = (1, 2, 3)
    assert _opened(png_encode(keyed)).info["transparency"] == (1, 2, 3)
