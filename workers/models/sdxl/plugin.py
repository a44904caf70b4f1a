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
           "lora_state_dict", "model_sampling", "predict", "renoise", "schedule",
           "text_encoder_lora_state_dict", "text_encoder_parts", "to_denoised", "write_tiny_stack"]


def model_sampling(width: int, height: int, shift: float | None = None) -> Any:
    """ComfyUI's ModelSamplingDiscrete (SD/SDXL's scaled-linear β table; eps and v-prediction
    share it: `to_denoised` tells them apart). SDXL has no shift: `shift` is ignored."""
    from workers.sampling.schedulers import DiscreteSampling

    return DiscreteSampling()


def write_tiny_stack(models_dir: Path) -> dict[str, str]:
    return {**tiny.write_smoke_stack(models_dir),
            "lora": tiny.write_tiny_lora(models_dir, text_encoders=True)}  # UNet + both CLIPs


def lora_state_dict(path: Path, denoiser: Any) -> dict[str, Any]:
    """{UNet module: (A, B, scale)} of an SDXL LoRA file in any format
    StableDiffusionXLPipeline.lora_state_dict reads (kohya's sgm names mapped with the UNet's
    config, diffusers / PEFT), its old attention-processor keys through diffusers'
    convert_unet_state_dict_to_peft, alphas per module. Text-encoder weights are left out."""
    from diffusers import StableDiffusionXLPipeline
    from diffusers.utils.state_dict_utils import convert_unet_state_dict_to_peft

    from workers.models.lora import peft_modules

    state, alphas = StableDiffusionXLPipeline.lora_state_dict(
        str(path), unet_config=denoiser.config, local_files_only=True)
    unet = {k.removeprefix("unet."): v for k, v in state.items() if k.startswith("unet.")}
    if not unet and not any(k.startswith("text_encoder") for k in state):
        unet = dict(state)  # bare module names
    if unet and not any(".lora_A." in k for k in unet):
        unet = convert_unet_state_dict_to_peft(unet)
    module_alphas = {}
    for key, alpha in (alphas or {}).items():
        if not key.startswith("unet."):
            continue
        name = key.removeprefix("unet.").removesuffix(".alpha")
        if name.endswith("down.weight"):  # an attention processor's key: convert it as its weight
            name = next(iter(convert_unet_state_dict_to_peft({name: 0}))).removesuffix(
                ".lora_A.weight")
        module_alphas[f"{name}.alpha"] = alpha
    return peft_modules(unet, module_alphas, "")


def text_encoder_parts(encoder: Any) -> dict[str, Any]:
    """SDXL's two CLIPs by diffusers' component names (its LoRA converters' prefixes)."""
    clip_l, big_g = encoder.model
    return {"text_encoder": clip_l, "text_encoder_2": big_g}


def text_encoder_lora_state_dict(path: Path, encoder: Any, denoiser: Any) -> dict[str, Any]:
    """{"text_encoder[_2].<module>": (A, B, scale)} of an SDXL LoRA file's CLIP-L and bigG
    halves (kohya `lora_te1_` / `lora_te2_`, diffusers `text_encoder[_2].`), through
    StableDiffusionXLPipeline.lora_state_dict (the UNet's config maps the file's other half)."""
    from diffusers import StableDiffusionXLPipeline

    from workers.models.lora import encoder_modules

    state, alphas = StableDiffusionXLPipeline.lora_state_dict(
        str(path), unet_config=denoiser.config, local_files_only=True)
    return {name: weights for prefix, part in text_encoder_parts(encoder).items()
            for name, weights in encoder_modules(state, alphas, prefix, part).items()}
