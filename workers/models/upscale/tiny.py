"""Tiny random upscale nets for tests and `./farm models smoke`: an RRDBNet saved in the new
(Real-ESRGAN) key layout or the original ESRGAN one, and an SRVGGNetCompact. The same seed
always builds the same weights."""

from __future__ import annotations

from pathlib import Path

import torch

from workers.models.upscale import UpscaleSpec
from workers.models.upscale.nets import build

SMOKE_NAME = "smoke-esrgan-x4.safetensors"
# nf 8, one RRDB of growth 4, ×4: its receptive radius is about 19 input pixels.
TINY_ESRGAN = UpscaleSpec("esrgan", 4, 3, 3, features=8, blocks=1, growth=4, upsamples=2)


def tiny_net(spec: UpscaleSpec = TINY_ESRGAN, seed: int = 0) -> torch.nn.Module:
    """A net of `spec` with seeded random weights (scaled so that outputs stay near 0..1)."""
    net = build(spec)
    generator = torch.Generator("cpu").manual_seed(seed)
    with torch.no_grad():
        for param in net.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    return net.eval()


def old_layout(state: dict[str, torch.Tensor], spec: UpscaleSpec) -> dict[str, torch.Tensor]:
    """An RRDBNet's new-layout state dict in the original ESRGAN layout (`model.N…`)."""
    tail = 3 * spec.upsamples  # model.3, model.6, …: an up-conv after each upsample + lrelu
    names = {"conv_first": "model.0", "conv_body": f"model.1.sub.{spec.blocks}",
             "conv_hr": f"model.{tail + 2}", "conv_last": f"model.{tail + 4}",
             **{f"conv_up{k}": f"model.{3 * k}" for k in range(1, spec.upsamples + 1)}}
    old = {}
    for key, value in state.items():
        stem, _, kind = key.rpartition(".")
        if stem.startswith("body."):
            _, n, rdb, conv = stem.split(".")
            old[f"model.1.sub.{n}.{rdb.upper()}.{conv}.0.{kind}"] = value
        else:
            old[f"{names[stem]}.{kind}"] = value
    return old


def write_tiny_upscaler(models_dir: Path, name: str = SMOKE_NAME,
                        spec: UpscaleSpec = TINY_ESRGAN, seed: int = 0,
                        layout: str = "new") -> Path:
    """Save a tiny random net as `upscale_models/<name>`: `.safetensors` or `.pth` by the
    name, keys in the `new` or `old` (original ESRGAN) layout."""
    state = {k: v.contiguous() for k, v in tiny_net(spec, seed).state_dict().items()}
    if layout == "old":
        state = old_layout(state, spec)
    path = Path(models_dir) / "upscale_models" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if name.endswith(".pth"):
        torch.save({"params_ema": state}, path)  # as Real-ESRGAN's releases wrap them
    else:
        from safetensors.torch import save_file

        save_file(state, str(path))
    return path
