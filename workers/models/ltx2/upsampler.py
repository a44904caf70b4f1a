"""LTX-2's latent upsampler: a `latent_upscale_models/` file (ComfyUI's LatentUpscaleModelLoader
folder) as diffusers' `LTX2LatentUpsamplerModel`, cached per worker, and `upsample`, which
doubles a clip's video latents as `LTX2LatentUpsamplePipeline` does (the VAE's statistics undone,
the net, the statistics redone: ComfyUI's LTXVLatentUpsampler).

Lightricks' files (ltx-2-spatial-upscaler-x2-*.safetensors) keep the net in the keys diffusers
uses (`initial_conv`, `res_blocks.N`, `upsampler`, `post_upsample_res_blocks.N`, `final_conv`);
the architecture is read from those keys' shapes, a rational resampler's scale from the file's
`config` metadata (ComfyUI's reader). Spatial upsamplers only: a temporal one changes the clip's
frame count, which the farm's clip latents do not follow yet.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from workers.device.policy import DevicePolicy, Placement
from workers.models.cache import MODEL_CACHE
from workers.models.catalog import file_sha256, resolve
from workers.models.family import ModelLoadError
from workers.models.ltx2 import UPSAMPLER_KEYS
from workers.models.weights import rest

FOLDER = "latent_upscale_models"
_BLUR = "upsampler.blur_down.kernel"  # a fixed buffer diffusers saves and Lightricks' files lack


@dataclass(frozen=True, eq=False)
class LatentUpscaleModel:
    """`latent-upscale-model` port: a loaded LTX-2 latent upsampler."""

    name: str  # the file name in latent_upscale_models/
    sha256: str
    net: Any  # LTX2LatentUpsamplerModel, resting per placement
    placement: Placement


def config_of(shapes: dict[str, tuple[int, ...]], metadata: dict[str, str], name: str
              ) -> dict[str, Any]:
    """LTX2LatentUpsamplerModel's config of a file's tensor shapes (and its `config` metadata
    for a rational resampler's scale); ModelLoadError naming the file for anything else."""
    if not all(key in shapes for key in UPSAMPLER_KEYS):
        raise ModelLoadError(f"{name} in {FOLDER}/ is no LTX-2 latent upsampler (it lacks "
                             f"{' or '.join(UPSAMPLER_KEYS)})")
    conv = shapes["initial_conv.weight"]  # [mid, in, (t,) k, k]
    mid, blocks = conv[0], len({m[1] for k in shapes if (m := re.match(r"res_blocks\.(\d+)\.", k))})
    config = {"in_channels": conv[1], "mid_channels": mid, "num_blocks_per_stage": blocks,
              "dims": len(conv) - 2}
    if "upsampler.conv.weight" in shapes:  # conv → pixel shuffle by p → blur-down by q
        meta = json.loads(metadata.get("config", "{}"))
        scale = meta.get("spatial_scale", meta.get("rational_spatial_scale"))
        if scale is None:
            raise ModelLoadError(f"{name} in {FOLDER}/ is a rational-scale LTX-2 upsampler "
                                 "without its scale (the file's `config` metadata)")
        return {**config, "spatial_upsample": True, "temporal_upsample": False,
                "use_rational_resampler": True, "rational_spatial_scale": float(scale)}
    out = shapes.get("upsampler.0.weight")
    if out is None or len(out) != 4 or out[0] != 4 * mid:
        raise ModelLoadError(f"{name} in {FOLDER}/ upsamples in time (or in an unknown way): "
                             "only spatial LTX-2 latent upsamplers run on this farm")
    return {**config, "spatial_upsample": True, "temporal_upsample": False,
            "use_rational_resampler": False}


def load_latent_upsampler(models_dir: Path, name: str, policy: DevicePolicy) -> LatentUpscaleModel:
    """`latent_upscale_models/<name>` as its net (cached by content and placement). Raises
    ModelFileMissing (naming where it belongs) or ModelLoadError (naming the file)."""
    path = resolve(models_dir, FOLDER, name)
    sha, placement = file_sha256(path), policy.placement("upscaler")

    def load() -> LatentUpscaleModel:
        from diffusers.pipelines.ltx2.latent_upsampler import LTX2LatentUpsamplerModel
        from safetensors import safe_open
        from safetensors.torch import load_file

        try:
            with safe_open(str(path), "pt") as f:
                metadata = f.metadata() or {}
            state = load_file(str(path))
        except Exception as exc:  # noqa: BLE001 — any reader error becomes the file's load error
            raise ModelLoadError(f"cannot read {name} in {FOLDER}/ as safetensors "
                                 f"({type(exc).__name__}: {exc})") from None
        config = config_of({k: tuple(v.shape) for k, v in state.items()}, metadata, name)
        net = LTX2LatentUpsamplerModel(**config)
        missing, unexpected = net.load_state_dict(state, strict=False)
        if unexpected or set(missing) - {_BLUR}:
            raise ModelLoadError(f"{name} in {FOLDER}/ does not fit the LTX-2 latent upsampler "
                                 f"its shapes describe: missing {sorted(set(missing) - {_BLUR})}"
                                 f", unexpected {sorted(unexpected)}")
        net.to(placement.torch_dtype)
        return LatentUpscaleModel(name, sha, rest(net, placement).requires_grad_(False), placement)

    return MODEL_CACHE.get_or_load(("latent-upscaler", sha, placement), load)


def upsample(model: LatentUpscaleModel, vae: Any, latents: torch.Tensor) -> torch.Tensor:
    """Normalised video latents [1, C, F, h, w] (the VAE's statistics) → [1, C, F, 2h, 2w],
    normalised, float32 on the CPU: LTX2LatentUpsamplePipeline(latents, latents_normalized=True,
    output_type="latent") renormalised."""
    from diffusers.pipelines.ltx2.pipeline_ltx2 import LTX2Pipeline
    from diffusers.pipelines.ltx2.pipeline_ltx2_latent_upsample import (
        LTX2LatentUpsamplePipeline,
    )

    net, device = model.net, model.placement.device
    mean, std, factor = vae.latents_mean.cpu(), vae.latents_std.cpu(), vae.config.scaling_factor
    raw = LTX2LatentUpsamplePipeline._denormalize_latents(latents.float(), mean, std, factor)
    try:
        with torch.inference_mode():
            out = net.to(device)(raw.to(device, net.dtype)).float().cpu()
    finally:
        if model.placement.offload:
            net.to("cpu")
    return LTX2Pipeline._normalize_latents(out, mean, std, factor)
