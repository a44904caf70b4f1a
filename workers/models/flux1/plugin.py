"""FLUX.1's side of the family contract (workers/models/family.py `FamilyPlugin`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
           "load_text_encoder", "load_vae", "lora_state_dict", "model_sampling", "predict",
           "renoise", "schedule", "to_denoised", "write_tiny_stack"]


def write_tiny_stack(models_dir: Path) -> dict[str, str]:
    return {**tiny.write_smoke_stack(models_dir), "lora": tiny.write_tiny_lora(models_dir)}


def lora_state_dict(path: Path, denoiser: Any) -> dict[str, Any]:
    """{transformer module: (A, B, scale)} of a FLUX.1 LoRA file in any format
    FluxPipeline.lora_state_dict reads (kohya / ComfyUI, diffusers / PEFT, XLabs, …): its
    converters, alphas as diffusers applies them. Text-encoder weights are left out."""
    from diffusers import FluxPipeline

    from workers.models.lora import peft_modules

    state, alphas = FluxPipeline.lora_state_dict(str(path), return_alphas=True,
                                                 local_files_only=True)
    if not any(k.startswith("transformer.") for k in state):
        state = {f"transformer.{k}": v for k, v in state.items()}  # bare module names
        alphas = {f"transformer.{k}": v for k, v in (alphas or {}).items()}
    return peft_modules(state, alphas, "transformer.")


def to_denoised(job: Any, output: Any) -> Any:
    """The x0 estimate x − σ·v at the job's current evaluation (CONST sampling)."""
    return job.latents - job.sigmas[job.step] * output


def model_sampling(width: int, height: int, shift: float | None = None) -> Any:
    """ComfyUI's ModelSamplingFlux: its shift mu from the image's tokens (as the pipeline's
    schedule and ComfyUI's ModelSamplingFlux node compute it); a given `shift` is the sample
    node's time shift α = e^mu (engine.schedule's meaning), so mu = ln α."""
    import math

    from diffusers.pipelines.flux.pipeline_flux import calculate_shift

    from workers.models.flux1 import LATENT
    from workers.models.flux1.engine import scheduler_config
    from workers.sampling.schedulers import FlowSampling

    if shift is not None:
        return FlowSampling(math.log(float(shift)), flux=True)
    cfg = scheduler_config()
    mu = calculate_shift(LATENT.tokens(height // LATENT.downscale, width // LATENT.downscale),
                         cfg["base_image_seq_len"], cfg["max_image_seq_len"],
                         cfg["base_shift"], cfg["max_shift"])
    return FlowSampling(float(mu), flux=True)
