"""Stable Diffusion XL (base) through diffusers: the `sdxl` model family. This module is
torch-free.

- `FAMILY` (here): the family's facts and how it recognises its files (workers/models/family.py).
- `plugin`: the contract's torch half; `loading` (diffusers' single-file conversion, configs and
  tokenizers shipped in `configs/`), `engine` (reproduces `StableDiffusionXLPipeline` /
  `StableDiffusionXLImg2ImgPipeline` bit for bit on CPU), `keys` (diffusers → the original
  layout, for the tiny stack), `tiny` (a random-weight all-in-one checkpoint).
Files: the all-in-one checkpoint studios download (`checkpoints/`: `model.diffusion_model.*`,
`conditioner.embedders.0.transformer.*` CLIP-L, `conditioner.embedders.1.model.*` OpenCLIP
bigG, `first_stage_model.*`), the UNet alone (`diffusion_models/`, original keys) and the
4-channel SDXL VAE alone (`vae/`).
"""

from __future__ import annotations

from workers.models.family import FamilyInfo, LatentFormat
from workers.models.header import ModelHeader

LATENT = LatentFormat(channels=4, downscale=8, patch=1)
UNET = "model.diffusion_model."  # the original layout's prefixes
BIG_G = "conditioner.embedders.1.model."
V_PRED = "v_pred"  # ComfyUI marks v-prediction checkpoints with this (empty) tensor


def recognise(header: ModelHeader) -> str | None:
    """checkpoint: an SDXL UNet (its `label_emb`: the size/pooled-text embedding), OpenCLIP
    bigG and a VAE in one file; unet: the UNet alone (original keys, with or without its
    prefix, or a diffusers folder); vae: a 4-channel AutoencoderKL; lora: a LoRA of the SDXL
    UNet (is_sdxl_lora)."""
    if header.is_lora():
        return "lora" if is_sdxl_lora(header) else None
    if header.has(UNET, "label_emb.") and header.has(BIG_G) and header.has("first_stage_model."):
        return "checkpoint"
    if header.has(BIG_G) or header.has("first_stage_model."):
        return None  # another model's parts (a refiner, an SD2 checkpoint)
    if is_unet(header):
        return "unet"
    if (header.class_name == "AutoencoderKL" or "decoder.conv_in.weight" in header.shapes) \
            and header.latent_channels() == 4:
        return "vae"
    return None


def is_sdxl_lora(header: ModelHeader) -> bool:
    """kohya's SDXL names (the sgm UNet's `input_blocks` / `middle_block` / `output_blocks`,
    its second text encoder `lora_te2_`) or diffusers' UNet names (`down_blocks.N.attentions`)."""
    return any(header.has(f) for f in ("lora_unet_input_blocks_", "lora_unet_middle_block_",
                                        "lora_unet_output_blocks_", "lora_te2_")) or (
        header.has("down_blocks.", "attentions.") or header.has("up_blocks.", "attentions."))


def is_unet(header: ModelHeader) -> bool:
    if header.class_name == "UNet2DConditionModel":
        return header.config.get("addition_embed_type") == "text_time"
    return any(k in header.shapes for k in ("label_emb.0.0.weight", UNET + "label_emb.0.0.weight")) \
        and header.has("middle_block.")


FAMILY = FamilyInfo(
    id="sdxl",
    title="Stable Diffusion XL",
    latent=LATENT,
    recognise=recognise,
    splits=False,
    activation_gb=1.5,
    activation_gb_per_mpx=3.0,
    guidance="cfg",
    cfg_offset=1.0,  # the farm's guidance g is cond + g·(cond − uncond): the pipeline's scale g + 1
)
