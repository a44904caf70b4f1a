"""Krea 2's side of the family contract (workers/models/family.py `FamilyPlugin`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workers.models.flow import to_denoised
from workers.models.krea2 import tiny
from workers.models.krea2.engine import (
    decode_latents_batch,
    encode_image,
    encode_prompts,
    predict,
    renoise,
    schedule,
)
from workers.models.krea2.loading import load_diffusion_model, load_text_encoder, load_vae

__all__ = ["decode_latents_batch", "encode_image", "encode_prompts", "load_diffusion_model",
           "load_text_encoder", "load_vae", "lora_state_dict", "model_sampling", "predict",
           "renoise", "schedule", "split_plan", "to_denoised", "write_tiny_stack"]


def write_tiny_stack(models_dir: Path) -> dict[str, str]:
    return {**tiny.write_smoke_stack(models_dir), "lora": tiny.write_tiny_lora(models_dir)}


def lora_state_dict(path: Path, denoiser: Any) -> dict[str, Any]:
    """{transformer module: (A, B, scale)} of a Krea 2 LoRA file in any format
    Krea2Pipeline.lora_state_dict reads (the reference trainer's / ComfyUI `diffusion_model.`,
    AI-Toolkit `base_model.model.`, diffusers / PEFT): its converter. Text-encoder weights are
    left out."""
    from diffusers import Krea2Pipeline

    from workers.models.lora import pipeline_lora_modules

    return pipeline_lora_modules(Krea2Pipeline, path)


def model_sampling(width: int, height: int, shift: float | None = None) -> Any:
    """ComfyUI's ModelSamplingFlux curve with the pipeline's shift mu from the image's tokens
    (256 → 6400 tokens: 0.5 → 1.15); a given `shift` is the time shift α = e^mu, so mu = ln α
    (turbo's fixed mu 1.15 is shift ≈ 3.158)."""
    import math

    from workers.models.flow import resolution_mu
    from workers.models.krea2 import LATENT
    from workers.models.krea2.engine import scheduler_config
    from workers.sampling.schedulers import FlowSampling

    if shift is not None:
        return FlowSampling(math.log(float(shift)), flux=True)
    tokens = LATENT.tokens(height // LATENT.downscale, width // LATENT.downscale)
    return FlowSampling(resolution_mu(scheduler_config(), tokens), flux=True)


def split_plan(transformer: Any) -> tuple[dict[str, Any], tuple[str, ...]]:
    """How a worker group splits the transformer (workers/parallel/split_family.py; diffusers
    0.42 has no plan for Krea 2): its single-stream blocks run over [text; image], so the first
    block's input and the rotary table are split by tokens and the last block's output gathered
    before the image tokens are sliced off; the key mask stays whole (Ulysses attention sees
    every token). And the forward arguments that hold one entry per batch row."""
    from workers.parallel.split_family import context_parallel_input, context_parallel_output

    last = len(transformer.transformer_blocks) - 1
    table = context_parallel_input(0, 2, output=True)
    plan = {"transformer_blocks.0": {"hidden_states": context_parallel_input(1, 3)},
            "rotary_emb": {0: table, 1: table},
            f"transformer_blocks.{last}": context_parallel_output(1, 3)}
    return plan, ("hidden_states", "encoder_hidden_states", "timestep", "encoder_attention_mask")
