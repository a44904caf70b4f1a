"""Qwen-Image 2.1 through diffusers: the `qwenimage21` model family. This module is torch-free.

Qwen-Image 2.1 shares Qwen-Image's name, not its parts, so it is its own family (a family has
one latent format, and 2.1's is another): a single-stream block-causal transformer
(`QwenImage21Transformer2DModel`: one shared `modulation`, `txt_in`, SwiGLU `img_mlp.gate_layer`)
that reads latents unpatched, a Qwen3-VL text encoder whose hidden states carry the prompt and
any condition images, and a 64-channel RGBA VAE that compresses 16× (`AutoencoderKLQwenImage21`).

- `FAMILY` (here): the family's facts and how it recognises its files (workers/models/family.py).
- `plugin`: the contract's torch half; `loading` (local-only: single files with sidecars or
  diffusers / transformers folders), `engine` (reproduces `QwenImage21Pipeline` bit for bit on
  CPU), `tiny` (a random-weight stack).
"""

from __future__ import annotations

from workers.models.family import FamilyInfo, LatentFormat
from workers.models.header import ModelHeader
from workers.models.lookalikes import is_qwen21_lora

# 64 channels at 1/16; the transformer reads each latent pixel as a token, but the text
# encoder's image slots (and so the image sides) come in 2×2 groups: sides are multiples of 32
LATENT = LatentFormat(channels=64, downscale=16, patch=2)
QWEN3_VL = ("Qwen3VLForConditionalGeneration", "Qwen3VLModel")
DIFFUSION_PREFIX = "model.diffusion_model."  # ComfyUI's saved-model prefix


def recognise(header: ModelHeader) -> str | None:
    """transformer: one shared `modulation` with `txt_in` and SwiGLU blocks; text_encoder: a
    Qwen3-VL (a Qwen3 language model with q/k norms and a vision tower with deepstack
    mergers); vae: a 64-channel RGBA VAE; lora: a LoRA of its transformer
    (lookalikes.is_qwen21_lora: its SwiGLU MLP's names, or attention alone 4096 wide)."""
    if header.is_lora():
        return "lora" if is_qwen21_lora(header) else None
    name = header.class_name
    if name == "QwenImage21Transformer2DModel" or (
        header.has("modulation.1.weight") and header.has("txt_in.in_layer.")
        and header.has("transformer_blocks.", ".img_mlp.gate_layer.")
    ):
        return "transformer"
    if name in QWEN3_VL or header.config.get("model_type") == "qwen3_vl" or (
        header.has("embed_tokens.weight") and header.has("self_attn.q_norm.")
        and header.has("visual.deepstack_merger_list.")
    ):
        return "text_encoder"
    if is_vae(header):
        return "vae"
    return None


def is_vae(header: ModelHeader) -> bool:
    """AutoencoderKLQwenImage21: diffusers' keys, a 64-channel `decoder.conv_in` and a
    4-channel (RGBA) `encoder.conv_in`."""
    if header.class_name == "AutoencoderKLQwenImage21":
        return True
    decoder, encoder = header.shapes.get("decoder.conv_in.weight"), header.shapes.get(
        "encoder.conv_in.weight")
    return bool(decoder and encoder and decoder[1] == LATENT.channels and encoder[1] == 4)


FAMILY = FamilyInfo(
    id="qwenimage21",
    title="Qwen-Image 2.1",
    latent=LATENT,
    recognise=recognise,
    splits=False,
    activation_gb=2.0,  # a 32-block single-stream transformer over text + image tokens
    activation_gb_per_mpx=4.0,  # 4096 target tokens per MP (16× VAE), plus condition images
    guidance="cfg",
    text_encoders=("Qwen3-VL",),
    nodes=("nodes",),
    cfg_offset=1.0,  # the farm's g: uncond + (g + 1)·(cond − uncond), the pipeline's true_cfg_scale g + 1
)
