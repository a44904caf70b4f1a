"""Tiled VAE decode vs untiled, side by side: peak memory, time, and how far the images are.

    .venv/bin/python -m bench.tiled_vae [--size 512] [--device cpu|cuda]

Random weights in the FLUX.1 / Z-Image VAE shape (diffusers AutoencoderKL, 16 latent channels,
blocks 128/256/512/512; `--width 64` halves them), one decode of a `size`² image per mode, each
mode in a fresh process: peak memory above the process's state before the decode (CPU: resident set, from
getrusage, with glibc's mmap threshold fixed so that freed tensors leave the resident set; CUDA:
torch's peak allocated), seconds, and the largest pixel difference (0–255) from the untiled
decode. Modes: untiled; `vae/decode-tiled` with 256-pixel tiles; diffusers' `enable_tiling`
(per-tile statistics: other pixels).

Measured (2-core CPU, `--size 768 --width 64`): untiled 1150 MB / 27.0 s; tiled-256 557 MB
(0.48×) / 185.7 s (6.89×), max pixel difference 1; diffusers-tiling 311 MB / 23.7 s, 49.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CONFIG = {"in_channels": 3, "out_channels": 3, "latent_channels": 16,
          "down_block_types": ["DownEncoderBlock2D"] * 4, "up_block_types": ["UpDecoderBlock2D"] * 4,
          "block_out_channels": [128, 256, 512, 512], "layers_per_block": 2,
          "norm_num_groups": 32, "use_quant_conv": False, "use_post_quant_conv": False}
MODES = ("untiled", "tiled-256", "diffusers-tiling")


def one(mode: str, size: int, device: str, out: str, width: int) -> None:
    import resource
    import time

    import torch
    from diffusers import AutoencoderKL

    from workers.models.tiled_vae import TiledAutoencoder

    torch.manual_seed(0)
    blocks = [width, 2 * width, 4 * width, 4 * width]
    vae: Any = AutoencoderKL(**{**CONFIG, "block_out_channels": blocks})
    vae = vae.eval().to(device)
    z = torch.randn(1, 16, size // 8, size // 8, generator=torch.Generator().manual_seed(1))
    z = z.to(device)
    if mode == "diffusers-tiling":
        vae.enable_tiling()
        vae.tile_sample_min_size, vae.tile_latent_min_size = size // 2, size // 16
    module: object = vae
    if mode.startswith("tiled-"):
        module = TiledAutoencoder(vae, int(mode.split("-")[1]), 64)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    started = time.perf_counter()
    with torch.no_grad():
        pixels = module.decode(z, return_dict=False)[0]  # type: ignore[attr-defined]
    if device == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    seconds = time.perf_counter() - started
    image = ((pixels.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).cpu()
    torch.save(image, out)
    print(json.dumps({"peak": peak, "seconds": seconds}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--width", type=int, default=128,
                        help="the VAE's first block width (FLUX.1's: 128; 64 is 4× cheaper)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one(args.one, args.size, args.device, args.out, args.width)
        return
    import tempfile

    import torch

    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in MODES:
            out = os.path.join(tmp, f"{mode}.pt")
            done = subprocess.run(
                [sys.executable, "-m", "bench.tiled_vae", "--one", mode, "--size", str(args.size),
                 "--device", args.device, "--out", out, "--width", str(args.width)],
                cwd=REPO, capture_output=True, text=True, check=True,
                # glibc returns big blocks to the OS only when they were mmapped: a fixed
                # threshold makes the resident set follow the live tensors
                env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"})
            rows[mode] = {**json.loads(done.stdout.strip().splitlines()[-1]),
                          "image": torch.load(out)}
    base = rows["untiled"]
    print(f"VAE decode of one {args.size}² image on {args.device} (FLUX.1 VAE shape, first "
          f"block {args.width} wide, random weights), each mode in a fresh process:")
    print(f"{'mode':18} {'peak MB':>9} {'÷ untiled':>10} {'seconds':>8} {'× untiled':>10} "
          f"{'max pixel diff':>15}")
    for mode, row in rows.items():
        diff = int((row["image"].int() - base["image"].int()).abs().max())
        print(f"{mode:18} {row['peak'] / 1e6:9.0f} {row['peak'] / base['peak']:10.2f} "
              f"{row['seconds']:8.2f} {row['seconds'] / base['seconds']:10.2f} {diff:15d}")


if __name__ == "__main__":
    main()
