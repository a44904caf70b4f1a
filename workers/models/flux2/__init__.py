"""FLUX.2 (dev and Klein) through diffusers: the `flux2` model family. This module is torch-free.

- `FAMILY` (here): the family's facts and how it recognises its files (workers/models/family.py).
- `plugin`: the contract's torch half; `loading`, `engine` (reproduces `Flux2KleinPipeline` /
  `Flux2Pipeline`'s denoise bit for bit on CPU), `keys` (the original / ComfyUI transformer
  layout), `tiny` (a random-weight Klein stack as studios lay FLUX.2 out).
Files: the `Flux2Transformer2DModel` (original `double_blocks.*` keys with the shared
`*_stream_modulation` layers, or diffusers'), the 32-channel `AutoencoderKLFlux2` (its latents'
batch-norm statistics `bn.running_*` tell it apart) and the text encoder: a Qwen3 for Klein
(the same files Z-Image reads: a loader names the family, ComfyUI's CLIPLoader type), a
Mistral-class LLM for dev.

Two variants, told apart by the transformer's own weights: dev embeds a distilled guidance
scale (`guidance_in` / `guidance_embedder` weights: one forward per step, the sampler's
`guidance` goes into the model); Klein has none and mixes classifier-free guidance.
"""

from __future__ import annotations

import math

from workers.models.family import FamilyInfo, LatentFormat
from workers.models.header import ModelHeader
from workers.models.lookalikes import is_flux2_lora, is_flux2_transformer, is_gemma, is_qwen3_vl

# ComfyUI's Flux2 latents: the VAE's 32 channels patchified 2×2 into 128 at ÷16 (one token each).
LATENT = LatentFormat(channels=128, downscale=16, patch=1)
VAE_CHANNELS = 32  # AutoencoderKLFlux2's own latent channels (before the 2×2 patchify)
QWEN3 = ("Qwen3Model", "Qwen3ForCausalLM")
MISTRAL = ("Mistral3ForConditionalGeneration", "MistralModel", "MistralForCausalLM")


def recognise(header: ModelHeader) -> str | None:
    """lora: a LoRA of FLUX.2's transformer (is_flux2_lora); transformer: the shared stream
    modulations (`single_stream_modulation.`, original and diffusers keys); vae: an
    AutoencoderKLFlux2 (32 latent channels and the batch-norm of its patchified latents);
    text_encoder: a Qwen3 (Klein) or a Mistral (dev) language model."""
    if header.is_lora():
        return "lora" if is_flux2_lora(header) else None
    name = header.class_name
    if is_flux2_transformer(header):
        return "transformer"
    if name == "AutoencoderKLFlux2" or (
        "bn.running_mean" in header.shapes and header.latent_channels() == VAE_CHANNELS
    ):
        return "vae"
    if text_encoder_kind(header) is not None:
        return "text_encoder"
    return None


def text_encoder_kind(header: ModelHeader) -> str | None:
    """"qwen3" (Klein's: per-head q_norm), "mistral" (dev's: a Mistral config, or a
    Mistral3's language model), else None."""
    name, model_type = header.class_name, header.config.get("model_type")
    if is_qwen3_vl(header) or is_gemma(header):  # Krea 2's, LTX-2's (workers/models/lookalikes.py)
        return None
    if name in QWEN3 or model_type == "qwen3" or (
        header.has("embed_tokens.weight") and header.has("self_attn.q_norm.weight")
        and not header.has("visual.")  # a Qwen3-VL (Qwen-Image 2.1's) has a vision tower
    ):
        return "qwen3"
    if name in MISTRAL or model_type in ("mistral", "mistral3") or (
        header.has("language_model.", "embed_tokens.weight")
        and not header.has("self_attn.q_norm.")  # Mistral has none; a Qwen3-VL has them
    ):
        return "mistral"
    return None


def empirical_mu(tokens: int, steps: int) -> float:
    """FLUX.2's sigma shift mu for `tokens` latent tokens sampled in `steps` steps (BFL's
    compute_empirical_mu, as diffusers' pipelines and ComfyUI's Flux2Scheduler have it)."""
    a1, b1 = 8.73809524e-05, 1.89833333
    a2, b2 = 0.00016927, 0.45666666
    if tokens > 4300:
        return a2 * tokens + b2
    m_200, m_10 = a2 * tokens + b2, a1 * tokens + b1
    a = (m_200 - m_10) / 190.0
    return a * steps + (m_200 - 200.0 * a)


def comfy_sigmas(steps: int, width: int, height: int) -> list[float]:
    """ComfyUI's Flux2Scheduler: `steps` + 1 sigmas from 1 to 0, t ↦ e^mu / (e^mu + 1/t − 1)
    over an even t grid, mu from the image's 16-px tokens and the steps."""
    mu = empirical_mu(round(width * height / (16 * 16)), steps)
    grid = [1.0 - i / steps for i in range(steps + 1)]
    return [math.exp(mu) / (math.exp(mu) + (1 / t - 1)) if t > 0 else 0.0 for t in grid]


FAMILY = FamilyInfo(
    id="flux2",
    title="FLUX.2",
    latent=LATENT,
    recognise=recognise,
    splits=True,  # one image's tokens / CFG rows across a GPU group (workers/parallel/split_family.py)
    nodes=("edit", "scheduler"),
    # Klein 4B–9B and dev 32B at 1 MP: the text sequence (512) and reference tokens dominate.
    activation_gb=2.0,
    activation_gb_per_mpx=5.0,
    guidance="cfg",  # Klein's; dev's embedded scale is per model (plugin.distilled)
    text_encoders=("Qwen3 (Klein) or Mistral (dev)",),
    # Klein's pipeline guides only above scale 1: the farm's g is its scale − 1 (and ComfyUI's
    # cfg − 1), uncond + (g + 1)·(cond − uncond); g = 0 is one forward per step
    cfg_offset=1.0,
)
