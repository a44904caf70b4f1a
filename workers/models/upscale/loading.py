"""Load an `upscale_models/` file (`.pth` through `torch.load(weights_only=True)`, or
`.safetensors`) as its net, cached per worker process; run it over an image in tiles."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from workers.device.policy import DevicePolicy, Placement
from workers.models.cache import MODEL_CACHE
from workers.models.catalog import file_sha256, resolve
from workers.models.family import ModelLoadError
from workers.models.header import SAFETENSORS_SUFFIXES
from workers.models.upscale import NotAnUpscaler, UpscaleSpec, esrgan_names, recognise, unwrap
from workers.models.upscale.nets import build
from workers.models.weights import rest

FOLDER = "upscale_models"
MIN_TILE = 32  # halving the tile on out-of-memory stops here


@dataclass(frozen=True, eq=False)
class UpscaleModel:
    """`upscale-model` port: a loaded upscale net and what it is."""

    name: str  # the file name in upscale_models/
    sha256: str
    net: Any  # workers.models.upscale.nets.RRDBNet | SRVGGNetCompact, resting per placement
    spec: UpscaleSpec
    placement: Placement


def load_upscale_model(models_dir: Path, name: str, policy: DevicePolicy) -> UpscaleModel:
    """`upscale_models/<name>` as its net (cached by content and placement). Raises
    ModelFileMissing (naming where it belongs) or ModelLoadError (naming the file)."""
    path = resolve(models_dir, FOLDER, name)
    sha, placement = file_sha256(path), policy.placement("upscaler")

    def load() -> UpscaleModel:
        state = _state_dict(path)
        try:
            spec = recognise({k: tuple(v.shape) for k, v in state.items()})
        except NotAnUpscaler as exc:
            raise ModelLoadError(f"cannot load {path.name} from {FOLDER}/: {exc}") from None
        if spec.arch == "esrgan":
            renamed = esrgan_names(list(state))
            state = {renamed[k]: v for k, v in state.items()}
        net = build(spec)
        net.load_state_dict(state, strict=True)
        net.to(placement.torch_dtype)
        return UpscaleModel(name, sha, rest(net, placement).requires_grad_(False), spec, placement)

    return MODEL_CACHE.get_or_load(("upscaler", sha, placement), load)


def _state_dict(path: Path) -> dict[str, torch.Tensor]:
    """The file's tensors (unwrapped from `params_ema` & co.); ModelLoadError naming the file
    for anything unreadable (a pickle that is not plain weights included)."""
    try:
        if path.name.lower().endswith(SAFETENSORS_SUFFIXES):
            from safetensors.torch import load_file

            state: dict[str, Any] = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 — any reader error becomes the file's load error
        raise ModelLoadError(f"cannot read {path.name} in {FOLDER}/ as weights "
                             f"({type(exc).__name__}: {exc})") from None
    state = unwrap(state) if isinstance(state, dict) else {}
    tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        raise ModelLoadError(f"{path.name} in {FOLDER}/ holds no weights (a dict of tensors)")
    return tensors


def upscale(model: UpscaleModel, image: torch.Tensor, *, tile: int, overlap: int,
            run: Callable[[Callable[[], torch.Tensor]], torch.Tensor] = lambda f: f(),
            progress: Callable[[int, int], None] = lambda done, total: None) -> torch.Tensor:
    """`image` [1, C, H, W] in 0..1 (CPU) upscaled by the model's scale: [1, C', H·s, W·s]
    float32 on the CPU, unclamped.

    Tiles of `tile`² input pixels, each run with `overlap` pixels of context on every side and
    only its own part kept: the result is the untiled one (up to float rounding) whenever
    `overlap` covers the net's receptive radius, and close to it otherwise. `run(f)` runs each
    forward (the worker's device thread); `progress(done, total)` follows the tiles. A tile
    that runs out of device memory is retried at half the size (down to MIN_TILE), as ComfyUI
    does.
    """
    spec, m = model.spec, model.spec.multiple
    _, _, h, w = image.shape
    padded = _pad_to(image, m)
    while True:
        try:
            out = _tiled(model, padded, _down(tile, m), _up(overlap, m), run, progress)
            return out[..., : h * spec.scale, : w * spec.scale]
        except torch.OutOfMemoryError:
            if tile // 2 < MIN_TILE:
                raise
            tile //= 2


def _tiled(model: UpscaleModel, image: torch.Tensor, tile: int, overlap: int,
           run: Callable[[Callable[[], torch.Tensor]], torch.Tensor],
           progress: Callable[[int, int], None]) -> torch.Tensor:
    _, _, h, w = image.shape
    s = model.spec.scale
    out = torch.empty(1, model.spec.out_channels, h * s, w * s)
    boxes = [(y, x) for y in range(0, h, tile) for x in range(0, w, tile)]
    for done, (y0, x0) in enumerate(boxes, start=1):
        y1, x1 = min(y0 + tile, h), min(x0 + tile, w)
        ya, xa, yb, xb = max(0, y0 - overlap), max(0, x0 - overlap), min(h, y1 + overlap), min(
            w, x1 + overlap)
        result = run(partial(_forward, model, image[..., ya:yb, xa:xb]))
        out[..., y0 * s:y1 * s, x0 * s:x1 * s] = result[
            ..., (y0 - ya) * s:(y1 - ya) * s, (x0 - xa) * s:(x1 - xa) * s]
        progress(done, len(boxes))
    return out


def _forward(model: UpscaleModel, piece: torch.Tensor) -> torch.Tensor:
    """One tile through the net on its device (visiting it when offloaded), back as CPU fp32."""
    device, dtype = model.placement.device, model.placement.torch_dtype
    net = model.net.to(device) if model.placement.offload else model.net
    try:
        with torch.inference_mode():
            return net(piece.to(device, dtype)).float().cpu()
    finally:
        if model.placement.offload:
            net.to("cpu")


def _pad_to(image: torch.Tensor, m: int) -> torch.Tensor:
    """`image` padded right and bottom (edge pixels repeated) to sides that are multiples of
    `m` (a pixel-unshuffling net's need); the padded part of the result is cut off after."""
    _, _, h, w = image.shape
    dh, dw = -h % m, -w % m
    if not dh and not dw:
        return image
    return torch.nn.functional.pad(image, (0, dw, 0, dh), mode="replicate")


def _down(value: int, m: int) -> int:
    return max(m, value - value % m)


def _up(value: int, m: int) -> int:
    return value + (-value % m)
