"""A take's PNG: workers/png.py (Up filter, deflate in pieces on threads) vs Pillow's encoder
(adaptive filter per row, one thread), both at zlib level 1, on the same images in one run.

Images: a 256² render of the tiny random-weight stack is noise (what bench/generate's takes
are), so noise at 256² and 1024²; a smooth 1024² image (a bicubic upscale of 32² random
colours, as a render's flat areas) and the same with ±6 grain. Printed: ms per encode (median
of `--runs`, the two encoders alternating) and the file sizes.

    .venv/bin/python bench/png.py [--runs 20]
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workers.png import COMPRESS_LEVEL, THREADS, png_encode


def images() -> dict[str, Image.Image]:
    rng = np.random.default_rng(0)
    smooth = Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).resize(
        (1024, 1024), Image.Resampling.BICUBIC)
    grain = np.clip(np.asarray(smooth).astype(np.int16) + rng.integers(-6, 7, (1024, 1024, 3)),
                    0, 255).astype(np.uint8)
    return {
        "noise 256²": Image.fromarray(rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)),
        "noise 1024²": Image.fromarray(rng.integers(0, 256, (1024, 1024, 3), dtype=np.uint8)),
        "smooth 1024²": smooth,
        "grainy 1024²": Image.fromarray(grain),
    }


def pillow(image: Image.Image, text: dict[str, str]) -> bytes:
    from PIL import PngImagePlugin

    info = PngImagePlugin.PngInfo()
    for key, value in text.items():
        info.add_text(key, value)
    out = io.BytesIO()
    image.save(out, format="PNG", pnginfo=info, compress_level=COMPRESS_LEVEL)
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    text = {"inline-farm": '{"graphSha256": "' + "0" * 64 + '", "seed": 1}'}
    print(f"bench/png: zlib level {COMPRESS_LEVEL}, {args.runs} encodes each, alternating; "
          f"workers/png.py on up to {THREADS} threads")
    print(f"  {'image':<14} {'Pillow ms':>10} {'ours ms':>10} {'ratio':>7} {'Pillow KB':>10} "
          f"{'ours KB':>10}")
    for name, image in images().items():
        times: dict[str, list[float]] = {"pillow": [], "ours": []}
        sizes = {"pillow": len(pillow(image, text)), "ours": len(png_encode(image, text))}
        for _ in range(args.runs):
            for label, encode in (("pillow", pillow), ("ours", png_encode)):
                start = time.perf_counter()
                encode(image, text)
                times[label].append((time.perf_counter() - start) * 1000)
        a, b = statistics.median(times["pillow"]), statistics.median(times["ours"])
        print(f"  {name:<14} {a:10.2f} {b:10.2f} {a / b:6.2f}x {sizes['pillow'] / 1024:10.0f} "
              f"{sizes['ours'] / 1024:10.0f}")


if __name__ == "__main__":
    main()
