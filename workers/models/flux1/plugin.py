"""FLUX.1's side of the family contract (workers/models/family.py `FamilyPlugin`)."""

from __future__ import annotations

from pathlib import Path

from workers.models.flux1 import tiny
from workers.models.flux1.engine import (
    decode_latents_batch,
    encode_image,
    encode_prompts,
    predict,
    renoise,
    schedule,
)
from workers.models.flux1.loading import load_diffusion_model, load_text_encoder, load_vae

__all__ = ["decode_latents_batch", "encode_image", "encode_prompts", "load_diffusion_model",
           "load_text_encoder", "load_vae", "predict", "renoise", "schedule", "write_tiny_stack"]


def write_tiny_stack(models_dir: Path) -> dict[str, str]:
    return tiny.write_smoke_stack(models_dir)
