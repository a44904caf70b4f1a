"""The mid-size random-weight Z-Image transformer the CPU benches share (~18 M parameters: what
this CPU renders in seconds), beside the tiny smoke stack's VAE and text encoder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

MID_CONFIG: dict[str, Any] = {  # head dim 64 = sum(axes_dims); cap_feat_dim = the tiny encoder's
    "all_patch_size": [2], "all_f_patch_size": [1], "in_channels": 16, "dim": 384,
    "n_layers": 6, "n_refiner_layers": 2, "n_heads": 6, "n_kv_heads": 6, "norm_eps": 1e-5,
    "qk_norm": True, "cap_feat_dim": 16, "rope_theta": 256.0, "t_scale": 1000.0,
    "axes_dims": [32, 16, 16], "axes_lens": [1536, 512, 512],
}


def mid_transformer() -> Any:
    """The transformer, seeded: every bench gets the same weights."""
    from diffusers import ZImageTransformer2DModel

    torch.manual_seed(0)
    return ZImageTransformer2DModel.from_config(MID_CONFIG).eval()


def write_mid(models_dir: Path, name: str) -> str:
    """Save it as `diffusion_models/<name>.safetensors` (+ its config); the file name."""
    from safetensors.torch import save_file

    folder = models_dir / "diffusion_models"
    save_file({k: v.contiguous() for k, v in mid_transformer().state_dict().items()},
              folder / f"{name}.safetensors")
    (folder / f"{name}.config.json").write_text(
        json.dumps({"_class_name": "ZImageTransformer2DModel", **MID_CONFIG}))
    return f"{name}.safetensors"
