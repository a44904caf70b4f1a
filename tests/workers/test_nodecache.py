"""The worker's node cache is bounded in bytes and evicts the least recently used."""

from __future__ import annotations

from PIL import Image

from workers.nodecache import NodeCache, size_of


def _image(side: int) -> Image.Image:
    return Image.new("RGB", (side, side))


def test_images_count_by_their_pixels():
    assert size_of({"image": _image(100)}) >= 100 * 100 * 3


def test_the_cache_holds_at_most_its_bytes_and_forgets_the_oldest_first():
    one = size_of({"image": _image(512)})
    cache = NodeCache(max_bytes=int(one * 2.5))
    for key in ("a", "b", "c"):
        cache.put(key, {"image": _image(512)}, {})
    assert cache.bytes <= cache.max_bytes and len(cache) == 2
    assert cache.get("a") is None and cache.get("c") is not None


def test_an_output_larger_than_the_whole_cache_is_not_kept():
    cache = NodeCache(max_bytes=1000)
    cache.put("huge", {"image": _image(2048)}, {})
    assert len(cache) == 0 and cache.bytes == 0
