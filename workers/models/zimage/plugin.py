"""Z-Image's side of the family contract (workers/models/family.py `FamilyPlugin`): the names
the generic nodes, the step batcher and `./farm models smoke` call, each one of this package's
functions."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workers.models.family import ModelLoadError
from workers.models.flow import to_denoised
from workers.models.values import TextEncoder
from workers.models.zimage import engine, loading, tiny
from workers.models.zimage.engine import (
    decode_latents_batch,
    encode_image,
    encode_prompts,
    renoise,
)
from workers.models.zimage.engine import predict_velocity as predict
from workers.models.zimage.loading import load_diffusion_model, load_vae

__all__ = ["decode_latents_batch", "encode_image", "encode_prompts", "load_diffusion_model",
           "load_text_encoder", "load_vae", "lora_state_dict", "model_sampling", "predict",
           "renoise", "schedule", "to_denoised", "write_tiny_stack"]

# Modules Z-Image's transformer feeds all items concatenated (not one row per item).
FLAT_INPUT = frozenset({"all_x_embedder", "cap_embedder", "siglip_embedder"})
SHIFT = 3.0  # ComfyUI's ModelSamplingAuraFlow for Z-Image (the scheduler config's shift)


def load_text_encoder(models_dir: Path, names: Sequence[str], policy: Any) -> TextEncoder:
    """Z-Image has one text encoder (a Qwen3)."""
    if len(names) != 1:
        raise ModelLoadError(f"Z-Image uses one text encoder (a Qwen3), got {len(names)} files")
    return loading.load_text_encoder(models_dir, names[0], policy)


def schedule(steps: int, width: int, height: int, denoise: float,
             shift: float | None = None) -> tuple[Any, Any]:
    """FlowMatchEuler, shift 3 (or `shift`), Z-Image's default sigmas (engine.sigma_schedule)."""
    return engine.sigma_schedule(steps, width, height, denoise, shift)


def write_tiny_stack(models_dir: Path) -> dict[str, str]:
    return {**tiny.write_smoke_stack(models_dir), "lora": tiny.write_tiny_lora(models_dir)}


def lora_state_dict(path: Path, denoiser: Any) -> dict[str, Any]:
    """{transformer module: (A, B, scale)} of a Z-Image LoRA file in any format
    ZImagePipeline.lora_state_dict reads (kohya, ComfyUI / ai-toolkit `diffusion_model.`,
    diffusers / PEFT): its converter bakes each module's alpha into the weights. Text-encoder
    keys are left out first (its converter would take them for the transformer's): Z-Image's
    encoder takes no LoRA here, and `load/lora` refuses that half when asked to apply it."""
    from diffusers import ZImagePipeline
    from safetensors.torch import load_file

    from workers.models.lora import TEXT_ENCODER_PREFIXES, peft_modules

    raw = {k: v for k, v in load_file(str(path)).items() if not k.startswith(TEXT_ENCODER_PREFIXES)}
    state = ZImagePipeline.lora_state_dict(raw)
    if not any(k.startswith("transformer.") for k in state):
        state = {f"transformer.{k}": v for k, v in state.items()}
    modules = peft_modules(state, None, "transformer.")
    flat = sorted(m for m in modules if m.split(".")[0] in FLAT_INPUT)
    if flat:  # their input is every item's tokens in one sequence: no row per item to add to
        raise ValueError(f"LoRAs on Z-Image's embedders ({', '.join(flat)}) are not supported")
    return modules


def model_sampling(width: int, height: int, shift: float | None = None) -> Any:
    """ComfyUI's model sampling for Z-Image: discrete flow, shift 3 unless given."""
    from workers.sampling.schedulers import FlowSampling

    return FlowSampling(SHIFT if shift is None else float(shift))
