"""Qwen-Image through diffusers: the `qwenimage` model family. This module is torch-free.

- `FAMILY` (here): the family's facts and how it recognises its files (workers/models/family.py).
- `plugin`: the contract's torch half; `loading` (local-only: ComfyUI single files or diffusers /
  transformers folders), `engine` (reproduces `QwenImagePipeline` bit for bit on CPU), `keys`
  (the VAE's original Wan layout), `tiny` (a random-weight stack as studios lay Qwen-Image out).
Files: the MMDiT transformer (`transformer_blocks.N.img_mod` / `txt_norm`, diffusers' keys, which
ComfyUI keeps, with or without `model.diffusion_model.`), the Qwen2.5-VL text encoder (one file:
its language model and vision tower) and the 16-channel Wan-style 3-D VAE (`qwen_image_vae`:
diffusers' keys or the original `encoder.conv1` / `decoder.head` ones).
"""

from __future__ import annotations

from workers.models.family import FamilyInfo, LatentFormat
from workers.models.header import ModelHeader
from workers.models.lookalikes import is_qwen21_lora

LATENT = LatentFormat(channels=16, downscale=8, patch=2)  # packed 2×2 into 64-wide tokens
QWEN25_VL = ("Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLModel")
DIFFUSION_PREFIX = "model.diffusion_model."  # ComfyUI's saved-model prefix


def recognise(header: ModelHeader) -> str | None:
    """lora: a LoRA of Qwen-Image's transformer (is_qwen_lora); transformer: its image/text
    modulation blocks and text norm; text_encoder: a Qwen2.5-VL (a Qwen2 language model, q/k/v
    biases and no q_norm, with its vision tower); vae: a 16-channel Wan-style 3-D VAE."""
    if header.is_lora():
        return "lora" if is_qwen_lora(header) else None
    name = header.class_name
    if name == "QwenImageTransformer2DModel" or (
        header.has("transformer_blocks.", ".img_mod.") and header.has("txt_norm.")
    ):
        return "transformer"
    if name in QWEN25_VL or header.config.get("model_type") == "qwen2_5_vl" or (
        header.has("embed_tokens.weight") and header.has("self_attn.q_proj.bias")
        and header.has("visual.") and not header.has("self_attn.q_norm.")
    ):
        return "text_encoder"
    if is_qwen_vae(header):
        return "vae"
    return None


def is_qwen_lora(header: ModelHeader) -> bool:
    """A LoRA of Qwen-Image's blocks: diffusers / ComfyUI (`transformer_blocks.0.img_mlp.`,
    `.txt_mlp.`, `.img_mod.`) or kohya (`lora_unet_transformer_blocks_0_img_mlp_`) names; not
    Qwen-Image 2.1's (its SwiGLU `img_mlp.gate_layer`, …: lookalikes.is_qwen21_lora)."""
    return any(header.has("transformer_blocks", part)  # FLUX.1's `double_blocks` have img_mlp
               for part in ("img_mlp", "txt_mlp", "img_mod", "txt_mod")) and not is_qwen21_lora(header)


def is_qwen_vae(header: ModelHeader) -> bool:
    """AutoencoderKLQwenImage (diffusers' keys: a 5-D `decoder.conv_in`) or the original Wan
    layout (`decoder.conv1`), 16 latent channels."""
    if header.class_name == "AutoencoderKLQwenImage":
        return True
    for key in ("decoder.conv_in.weight", "decoder.conv1.weight"):
        shape = header.shapes.get(key)
        if shape is not None and len(shape) == 5:
            return shape[1] == LATENT.channels
    return False


FAMILY = FamilyInfo(
    id="qwenimage",
    title="Qwen-Image",
    latent=LATENT,
    recognise=recognise,
    splits=True,  # one image's tokens / CFG rows across a GPU group (workers/parallel/split_family.py)
    activation_gb=2.0,  # 20.4 B transformer: long joint sequences (text + image tokens)
    activation_gb_per_mpx=6.0,
    nodes=("edit",),
    guidance="cfg",
    text_encoders=("Qwen2.5-VL",),
    cfg_offset=1.0,  # the farm's g: cond + g·(cond − uncond), the pipeline's true_cfg_scale g + 1
)
