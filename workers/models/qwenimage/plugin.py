"""Qwen-Image's side of the family contract (workers/models/family.py `FamilyPlugin`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workers.models.flow import to_denoised
from workers.models.qwenimage import tiny
from workers.models.qwenimage.engine import (
    decode_latents_batch,
    encode_image,
    encode_prompts,
    predict,
    renoise,
    schedule,
)
from workers.models.qwenimage.loading import load_diffusion_model, load_text_encoder, load_vae

__all__ = ["decode_latents_batch", "encode_image", "encode_prompts", "load_diffusion_model",
           "load_text_encoder", "load_vae", "lora_state_dict", "model_sampling", "predict",
           "renoise", "schedule", "split_plan", "to_denoised", "write_tiny_stack"]

SHIFT = 1.15  # ComfyUI's model sampling for Qwen-Image (its workflows set AuraFlow's 3.1)


def write_tiny_stack(models_dir: Path) -> dict[str, str]:
    return {**tiny.write_smoke_stack(models_dir), "lora": tiny.write_tiny_lora(models_dir)}


def lora_state_dict(path: Path, denoiser: Any) -> dict[str, Any]:
    """{transformer module: (A, B, scale)} of a Qwen-Image LoRA file in any format
    QwenImagePipeline.lora_state_dict reads (ComfyUI / ai-toolkit `diffusion_model.`, kohya,
    diffusers / PEFT): its converters, alphas as diffusers applies them. Text-encoder weights
    are left out."""
    from diffusers import QwenImagePipeline

    from workers.models.lora import pipeline_lora_modules

    return pipeline_lora_modules(QwenImagePipeline, path)


def model_sampling(width: int, height: int, shift: float | None = None) -> Any:
    """ComfyUI's model sampling for Qwen-Image: discrete flow (ModelSamplingAuraFlow's curve),
    shift 1.15 unless given."""
    from workers.sampling.schedulers import FlowSampling

    return FlowSampling(SHIFT if shift is None else float(shift))


def split_plan(transformer: Any) -> tuple[dict[str, Any], tuple[str, ...]]:
    """How a worker group splits the transformer (workers/parallel/split_family.py): diffusers'
    context-parallel plan, and the forward arguments that hold one entry per batch row."""
    return dict(transformer._cp_plan), (
        "hidden_states", "encoder_hidden_states", "encoder_hidden_states_mask", "timestep",
        "img_shapes", "guidance", "additional_t_cond")
