"""FLUX.1's side of the family contract (workers/models/family.py `FamilyPlugin`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workers.models.flow import to_denoised
from workers.models.flux1 import tiny
from workers.models.flux1.engine import (
    decode_latents_batch,
    encode_image,
    encode_prompts,
    fill_condition,
    predict,
    renoise,
    schedule,
)
from workers.models.flux1.loading import load_diffusion_model, load_text_encoder, load_vae

__all__ = ["decode_latents_batch", "encode_image", "encode_prompts", "fill_condition",
           "load_diffusion_model", "load_text_encoder", "load_vae", "lora_state_dict",
           "model_sampling", "predict", "renoise", "schedule", "split_plan",
           "text_encoder_lora_state_dict", "text_encoder_parts", "to_denoised", "write_tiny_stack"]

T5_KEYS = ("lora_te2_", "text_encoder_2.", "text_encoders.t5xxl.")  # a FLUX LoRA's T5 half


def write_tiny_stack(models_dir: Path) -> dict[str, str]:
    return {**tiny.write_smoke_stack(models_dir),
            "lora": tiny.write_tiny_lora(models_dir, text_encoder=True)}  # with its CLIP-L half


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


def text_encoder_parts(encoder: Any) -> dict[str, Any]:
    """The text encoder a FLUX.1 LoRA may adapt: CLIP-L (diffusers' `text_encoder`)."""
    clip, _t5 = encoder.model
    return {"text_encoder": clip}


def text_encoder_lora_state_dict(path: Path, encoder: Any, denoiser: Any) -> dict[str, Any]:
    """{"text_encoder.<module>": (A, B, scale)} of a FLUX.1 LoRA file's CLIP-L half (kohya
    `lora_te1_`, diffusers `text_encoder.`), through FluxPipeline.lora_state_dict. A T5 half
    (rare) is refused: diffusers' converters drop it, and a silent half would paint another
    image than the trainer's."""
    from diffusers import FluxPipeline

    from workers.models.lora import LoraMismatch, encoder_modules, text_encoder_keys

    t5 = [k for k in text_encoder_keys(path) if k.startswith(T5_KEYS)]
    if t5:
        raise LoraMismatch(f"loras/{path.name} has T5 text-encoder weights ({t5[0]}, …), which "
                           "this farm does not apply: set strength_clip to 0 (the transformer "
                           "half still applies)")
    state, alphas = FluxPipeline.lora_state_dict(str(path), return_alphas=True,
                                                 local_files_only=True)
    return encoder_modules(state, alphas, "text_encoder", text_encoder_parts(encoder)
                           ["text_encoder"])


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


def split_plan(transformer: Any) -> tuple[dict[str, Any], tuple[str, ...]]:
    """How a worker group splits the transformer (workers/parallel/split_family.py): diffusers'
    context-parallel plan, and the forward arguments that hold one entry per batch row."""
    return dict(transformer._cp_plan), ("hidden_states", "encoder_hidden_states",
                                        "pooled_projections", "timestep", "guidance")
