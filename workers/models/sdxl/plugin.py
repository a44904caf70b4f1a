"""SDXL's side of the family contract (workers/models/family.py `FamilyPlugin`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workers.models.sdxl import tiny
from workers.models.sdxl.engine import (
    advance,
    decode_latents_batch,
    encode_image,
    encode_prompts,
    init_noise,
    predict,
    renoise,
    schedule,
    to_denoised,
)
from workers.models.sdxl.loading import (
    load_checkpoint,
    load_diffusion_model,
    load_text_encoder,
    load_vae,
)

__all__ = ["advance", "decode_latents_batch", "encode_image", "encode_prompts", "init_noise",
           "load_checkpoint", "load_diffusion_model", "load_text_encoder", "load_vae",
           "model_sampling", "predict", "renoise", "schedule", "to_denoised", "write_tiny_stack"]


def model_sampling(width: int, height: int, shift: float | None = None) -> Any:
    """ComfyUI's ModelSamplingDiscrete (SD/SDXL's scaled-linear β table; eps and v-prediction
    share it: `to_denoised` tells them apart). SDXL has no shift: `shift` is ignored."""
    from workers.sampling.schedulers import DiscreteSampling

    return DiscreteSampling()


def write_tiny_stack(models_dir: Path) -> dict[str, str]:
    return tiny.write_smoke_stack(models_dir)
