"""Z-Image (Turbo) through diffusers: the `zimage` model family. This module is torch-free.

- `FAMILY` (here): the family's facts and how it recognises its files (the contract:
  workers/models/family.py).
- `plugin`: the contract's torch half (loading, engine, tiny stack behind one set of names).
- `loading`: transformer / VAE / text encoder from single files or folders, cached per process.
- `engine`: encode prompt → sigmas → transformer + Euler (via the step batcher) → VAE decode;
  reproduces `ZImagePipeline` / `ZImageImg2ImgPipeline` bit for bit on CPU.
- `turbo`: the one-node `zimage/turbo` runner; `preview`: its live previews.
- `tiny`: a tiny random-weight stack written in the ComfyUI layout, for smoke runs and tests.
"""

from __future__ import annotations

from workers.models.family import FamilyInfo, LatentFormat
from workers.models.header import ModelHeader
from workers.models.lookalikes import is_gemma, is_qwen3_vl

LATENT = LatentFormat(channels=16, downscale=8, patch=2)  # the Flux VAE, 2×2 patches
QWEN3 = ("Qwen3Model", "Qwen3ForCausalLM")


def recognise(header: ModelHeader) -> str | None:
    """transformer: Z-Image's caption embedder and refiners (diffusers or ComfyUI keys);
    text_encoder: a Qwen3 (its per-head q_norm); vae: a 16-channel AutoencoderKL (Flux's)."""
    if header.is_lora():
        return "lora" if is_zimage_lora(header) else None
    name = header.class_name
    if name == "ZImageTransformer2DModel" or (
        header.has("cap_embedder.") and header.has("noise_refiner.")
    ):
        return "transformer"
    if is_qwen3_vl(header) or is_gemma(header):
        return None  # Krea 2's Qwen3-VL and LTX-2's Gemma have the same q_norm (lookalikes.py)
    if name in QWEN3 or header.config.get("model_type") == "qwen3" or (
        header.has("embed_tokens.weight") and header.has("self_attn.q_norm.weight")
    ):
        return "text_encoder"
    if is_flux_vae(header):
        return "vae"
    return None


def is_zimage_lora(header: ModelHeader) -> bool:
    """A LoRA of Z-Image's transformer: its `layers.N.attention` / refiner blocks, in kohya
    (`lora_unet_layers_0_attention_to_q`) or diffusers / ComfyUI (`layers.0.attention.`) keys."""
    return any(header.has(f) for f in ("_attention_to_", ".attention.to_", "_feed_forward_",
                                        ".feed_forward.", "noise_refiner", "context_refiner"))


def is_flux_vae(header: ModelHeader) -> bool:
    """A 16-latent-channel AutoencoderKL (FLUX.1's `ae`, diffusers or original keys)."""
    vae = header.class_name == "AutoencoderKL" or "decoder.conv_in.weight" in header.shapes
    return vae and header.latent_channels() == 16


FAMILY = FamilyInfo(
    id="zimage",
    title="Z-Image Turbo",
    latent=LATENT,
    recognise=recognise,
    splits=True,  # workers/parallel: Ulysses / Ring (xfuser's Z-Image wrapper, or the CPU split)
    activation_gb=1.0,
    activation_gb_per_mpx=3.0,
    nodes=("turbo",),
    text_encoders=("Qwen3",),
    cfg_offset=1.0,  # its pipeline's CFG is cond + g·(cond − uncond)
)
