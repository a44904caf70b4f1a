"""FLUX.2's side of the family contract (workers/models/family.py `FamilyPlugin`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from workers.models.flow import to_denoised
from workers.models.flux2 import tiny
from workers.models.flux2.engine import (
    decode_latents_batch,
    encode_image,
    encode_prompts,
    predict,
    renoise,
    schedule,
)
from workers.models.flux2.loading import load_diffusion_model, load_text_encoder, load_vae

__all__ = ["decode_latents_batch", "distilled", "encode_image", "encode_prompts",
           "load_diffusion_model", "load_text_encoder", "load_vae", "lora_state_dict",
           "model_sampling", "predict", "renoise", "schedule", "split_plan", "to_denoised",
           "write_tiny_stack"]

COMFY_MU = 2.02  # ComfyUI's Flux2 model sampling (ModelSamplingFlux, shift = mu)


def distilled(model: Any) -> bool:
    """Whether `model` embeds a distilled guidance scale (dev: one forward per step, the
    sampler's guidance goes into the model) rather than mixing CFG (Klein)."""
    return bool(model.transformer.config.guidance_embeds)


def write_tiny_stack(models_dir: Path) -> dict[str, str]:
    return {**tiny.write_smoke_stack(models_dir), "lora": tiny.write_tiny_lora(models_dir)}


def lora_state_dict(path: Path, denoiser: Any) -> dict[str, Any]:
    """{transformer module: (A, B, scale)} of a FLUX.2 LoRA in any format
    Flux2KleinPipeline.lora_state_dict reads (diffusers / PEFT, ComfyUI `diffusion_model.`):
    its converters. Text-encoder weights are left out."""
    from diffusers import Flux2KleinPipeline

    from workers.models.lora import pipeline_lora_modules

    return pipeline_lora_modules(Flux2KleinPipeline, path)


def model_sampling(width: int, height: int, shift: float | None = None) -> Any:
    """ComfyUI's model sampling for FLUX.2: ModelSamplingFlux at mu 2.02; a given `shift` is
    the sample node's time shift α = e^mu (engine.schedule's meaning), so mu = ln α."""
    from workers.sampling.schedulers import FlowSampling

    return FlowSampling(COMFY_MU if shift is None else math.log(float(shift)), flux=True)


def split_plan(transformer: Any) -> tuple[dict[str, Any], tuple[str, ...]]:
    """How a worker group splits the transformer (workers/parallel/split_family.py): diffusers'
    context-parallel plan — its ids entries for batched ids [B, S, 4]; the farm passes the rows'
    shared ids [S, 4] (the transformer takes either), split on their first dimension — and the
    forward arguments that hold one entry per batch row."""
    from workers.parallel.split_family import context_parallel_input

    plan = dict(transformer._cp_plan)
    ids = context_parallel_input(0, 2)
    plan[""] = {**plan[""], "img_ids": ids, "txt_ids": ids}
    return plan, ("hidden_states", "encoder_hidden_states", "timestep", "guidance")
