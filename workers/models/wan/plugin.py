"""Wan's side of the family contract (workers/models/family.py `FamilyPlugin`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workers.models.family import LatentFormat
from workers.models.wan import T2V_CHANNELS, TEMPORAL, tiny
from workers.models.wan import latent_format as _format
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

__all__ = ["decode_latents_batch", "encode_image", "encode_prompts", "keeps_masked",
           "latent_format", "load_diffusion_model", "load_text_encoder", "load_vae",
           "lora_state_dict", "model_sampling", "predict", "renoise", "schedule", "split_plan",
           "to_denoised", "video_frames", "write_tiny_stack"]

keeps_masked = True  # a masked latent (TI2V's start frame) is held at its samples (engine)


def latent_format(model: Any) -> LatentFormat:
    """The latents `model` samples: TI2V-5B's (48 channels at ÷16, the Wan 2.2 VAE's) for a
    48-channel transformer, else Wan 2.1's 16 at ÷8."""
    config = getattr(model.transformer, "config", None)
    return _format(int(getattr(config, "in_channels", T2V_CHANNELS)))


def write_tiny_stack(models_dir: Path) -> dict[str, str]:
    return {**tiny.write_smoke_stack(models_dir), "lora": tiny.write_tiny_lora(models_dir)}


def lora_state_dict(path: Path, denoiser: Any) -> dict[str, Any]:
    """{transformer module: (A, B, scale)} of a Wan LoRA file in any format
    WanPipeline.lora_state_dict reads (ComfyUI / original `diffusion_model.blocks.N.self_attn.q`,
    diffusers / PEFT): its converters, alphas as diffusers applies them. Text-encoder weights
    are left out."""
    from diffusers import WanPipeline

    from workers.models.lora import pipeline_lora_modules

    return pipeline_lora_modules(WanPipeline, path)


def to_denoised(job: Any, output: Any) -> Any:
    """The x0 estimate x − σ·v at the job's current evaluation (CONST sampling)."""
    return job.latents - job.sigmas[job.step] * output


def model_sampling(width: int, height: int, shift: float | None = None) -> Any:
    """ComfyUI's model sampling for Wan: discrete flow, shift 8 unless given."""
    from workers.sampling.schedulers import FlowSampling

    return FlowSampling(SHIFT if shift is None else float(shift))


def video_frames(latent_frames: int) -> int:
    """The frames a clip of `latent_frames` latent frames decodes to (F = 4(F' − 1) + 1)."""
    return (latent_frames - 1) * TEMPORAL + 1


def split_plan(transformer: Any) -> tuple[dict[str, Any], tuple[str, ...]]:
    """How a worker group splits the transformer (workers/parallel/split_family.py): diffusers'
    context-parallel plan (it splits TI2V's per-token timesteps with the tokens), and the
    forward arguments that hold one entry per batch row."""
    return dict(transformer._cp_plan), ("hidden_states", "encoder_hidden_states", "timestep",
                                        "encoder_hidden_states_image")
