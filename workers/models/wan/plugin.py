"""Wan's side of the family contract (workers/models/family.py `FamilyPlugin`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workers.models.wan import tiny
from workers.models.wan.engine import (
    SHIFT,
    decode_latents_batch,
    encode_image,
    encode_prompts,
    predict,
    renoise,
    schedule,
)
from workers.models.wan.loading import load_diffusion_model, load_text_encoder, load_vae

__all__ = ["decode_latents_batch", "encode_image", "encode_prompts", "load_diffusion_model",
           "load_text_encoder", "load_vae", "model_sampling", "predict", "renoise", "schedule",
           "to_denoised", "write_tiny_stack"]


def write_tiny_stack(models_dir: Path) -> dict[str, str]:
    """The tiny stack (no LoRA: Wan models take none yet)."""
    return tiny.write_smoke_stack(models_dir)


def to_denoised(job: Any, output: Any) -> Any:
    """The x0 estimate x − σ·v at the job's current evaluation (CONST sampling)."""
    return job.latents - job.sigmas[job.step] * output


def model_sampling(width: int, height: int, shift: float | None = None) -> Any:
    """ComfyUI's model sampling for Wan: discrete flow, shift 8 unless given."""
    from workers.sampling.schedulers import FlowSampling

    return FlowSampling(SHIFT if shift is None else float(shift))
