"""Krea 2 through diffusers: the `krea2` model family. This module is torch-free.

- `FAMILY` (here): the family's facts and how it recognises its files (workers/models/family.py).
- `plugin`: the contract's torch half; `loading` (local-only: ComfyUI single files or diffusers /
  transformers folders), `engine` (reproduces `Krea2Pipeline` bit for bit on CPU), `keys` (the
  transformer's original / ComfyUI layout), `tiny` (a random-weight stack as studios lay it out).
Files: the single-stream MMDiT (`txtfusion.projector` in the original keys ComfyUI ships, with or
without `model.diffusion_model.`; `text_fusion.projector` in diffusers'), the Qwen3-VL text
encoder (`CLIPLoader` type `krea2`: a Qwen3 language model with its `visual.` tower) and
Qwen-Image's 16-channel Wan-style VAE (read by `qwenimage` first; Krea 2 decodes the same way).
"""

from __future__ import annotations

from workers.models.family import FamilyInfo, LatentFormat
from workers.models.header import ModelHeader
from workers.models.lookalikes import is_qwen3_vl

LATENT = LatentFormat(channels=16, downscale=8, patch=2)  # Qwen-Image's VAE, 2×2 patches
DIFFUSION_PREFIX = "model.diffusion_model."  # ComfyUI's saved-model prefix
LORA_MARKS = ("txtfusion", "text_fusion", ".attn.wq", "_attn_wq", ".attn.to_gate", "_attn_to_gate",
              "tproj", "txtmlp")


def recognise(header: ModelHeader) -> str | None:
    """lora: a LoRA of Krea 2's transformer (its gated attention or text fusion, original or
    diffusers names); transformer: its text-fusion projector; text_encoder: a Qwen3-VL; vae:
    Qwen-Image's 16-channel 3-D VAE."""
    if header.is_lora():
        return "lora" if any(header.has(m) for m in LORA_MARKS) else None
    if header.class_name == "Krea2Transformer2DModel" or header.has("txtfusion.projector.") or \
            header.has("text_fusion.projector."):
        return "transformer"
    if is_qwen3_vl(header):
        return "text_encoder"
    if is_qwen_vae(header):
        return "vae"
    return None


def is_qwen_vae(header: ModelHeader) -> bool:
    """AutoencoderKLQwenImage (a 5-D `decoder.conv_in`) or the original Wan layout
    (`decoder.conv1`), 16 latent channels."""
    if header.class_name == "AutoencoderKLQwenImage":
        return True
    for key in ("decoder.conv_in.weight", "decoder.conv1.weight"):
        shape = header.shapes.get(key)
        if shape is not None and len(shape) == 5:
            return shape[1] == LATENT.channels
    return False


FAMILY = FamilyInfo(
    id="krea2",
    title="Krea 2",
    latent=LATENT,
    recognise=recognise,
    splits=True,  # one image's tokens / CFG rows across a GPU group (workers/parallel/split_family.py)
    activation_gb=2.0,  # 12 B single-stream DiT over 512 text tokens + the image's
    activation_gb_per_mpx=5.0,
    guidance="cfg",
    text_encoders=("Qwen3-VL",),
    cfg_offset=1.0,  # its pipeline mixes cond + g·(cond − uncond): ComfyUI's cfg c is g = c − 1
)
