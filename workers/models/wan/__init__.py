"""Wan 2.1 / 2.2 video through diffusers: the `wan` model family. This module is torch-free.

- `FAMILY` (here): the family's facts and how it recognises its files (workers/models/family.py).
- `plugin`: the contract's torch half; `loading` (local-only: ComfyUI single files or diffusers /
  transformers folders), `engine` (reproduces `WanPipeline` / `WanImageToVideoPipeline` on CPU),
  `nodes` (latent/empty-video, vae/decode-video, frames/image, wan/image-to-video), `tiny` (a
  random-weight stack as studios lay Wan out).
Files: the WanTransformer3DModel (diffusers' `condition_embedder.` / `blocks.N.attn1.` keys, or
the original / ComfyUI `text_embedding.` / `blocks.N.self_attn.` ones, with or without
`model.diffusion_model.`; its 5-D `patch_embedding` says the variant: 16 input channels T2V, 36
I2V / first-last frame, 48 TI2V-5B), the UMT5 text encoder (a relative attention bias in every
block, where T5 has one in block 0) and the 3-D causal VAE (AutoencoderKLWan: 16 latent channels
for 2.1 and 2.2 A14B, 48 for 2.2 TI2V-5B). A 16-channel Wan VAE is also Qwen-Image's (the same
architecture): the Wan nodes read it as a Wan VAE whichever family the catalog lists first.
Video latents are [1, 16, F', H/8, W/8], F' = (F − 1)/4 + 1 frames; TI2V-5B's (the Wan 2.2 VAE,
2×2 pixel patches before its ÷8) are [1, 48, F', H/16, W/16] (`LATENT_22`), its transformer's
tokens 2×2 patches of those, so its sides are multiples of 32.
"""

from __future__ import annotations

import re

from workers.models.family import FamilyInfo, LatentFormat
from workers.models.header import ModelHeader

LATENT = LatentFormat(channels=16, downscale=8, patch=2)  # per frame; 1×2×2 patches
LATENT_22 = LatentFormat(channels=48, downscale=16, patch=2)  # TI2V-5B with the Wan 2.2 VAE
TEMPORAL = 4  # the VAE's frame compression: F frames ↔ (F − 1)/4 + 1 latent frames
DIFFUSION_PREFIX = "model.diffusion_model."  # ComfyUI's saved-model prefix
T2V_CHANNELS, I2V_CHANNELS, TI2V_CHANNELS = 16, 36, 48
# A LoRA key of Wan's blocks: a top-level `blocks.N.` (FLUX.1 / Qwen-Image / SDXL nest theirs
# under `transformer_blocks` / `down_blocks`), under any trainer's prefix.
LORA_KEY = re.compile(r"^(?:diffusion_model\.|transformer\.|model\.diffusion_model\.)?"
                      r"blocks\.\d+\.(?:self_attn|cross_attn|attn1|attn2|ffn)\.|"
                      r"^lora_unet_blocks_\d+_(?:self_attn|cross_attn|ffn)_")


def recognise(header: ModelHeader) -> str | None:
    """transformer: a 5-D patch embedding with Wan's text / condition embedder; text_encoder: a
    UMT5 encoder; vae: a 3-D causal VAE with 16 or 48 latent channels; lora: a LoRA of Wan's
    `blocks.N.self_attn` / `attn1` / `ffn` modules (ComfyUI, diffusers or kohya names)."""
    if header.is_lora():
        return "lora" if any(LORA_KEY.match(k) for k in header.shapes) else None
    if transformer_channels(header) is not None:
        return "transformer"
    if header.class_name == "UMT5EncoderModel" or header.has(
            "block.1.layer.0.SelfAttention.relative_attention_bias."):
        return "text_encoder"
    if vae_channels(header) is not None:
        return "vae"
    return None


def transformer_channels(header: ModelHeader) -> int | None:
    """A Wan transformer's input channels (16 T2V, 36 I2V, 48 TI2V), or None for another file."""
    if header.class_name == "WanTransformer3DModel":
        return int(header.config.get("in_channels", T2V_CHANNELS))
    shape = header.shape("patch_embedding.weight")
    if shape is None or len(shape) != 5:
        return None
    if header.has("condition_embedder.text_embedder.") or header.has("text_embedding."):
        return int(shape[1])
    return None


def vae_channels(header: ModelHeader) -> int | None:
    """A Wan VAE's latent channels (diffusers' 5-D `decoder.conv_in` or the original
    `decoder.conv1`), or None."""
    if header.class_name == "AutoencoderKLWan":
        return int(header.config.get("z_dim", LATENT.channels))
    for key in ("decoder.conv_in.weight", "decoder.conv1.weight"):
        shape = header.shapes.get(key)
        if shape is not None and len(shape) == 5 and shape[1] in (16, 48):
            return int(shape[1])
    return None


def variant(header: ModelHeader) -> str | None:
    """A Wan transformer's kind from its input channels: t2v (16), i2v (36: also first-last
    frame), ti2v (48: TI2V-5B); None for Wan's other files."""
    channels = transformer_channels(header)
    return {T2V_CHANNELS: "t2v", I2V_CHANNELS: "i2v", TI2V_CHANNELS: "ti2v"}.get(channels or 0)


def latent_format(channels: int) -> LatentFormat:
    """The latents of a transformer (its input channels) or VAE (its latent channels): the Wan
    2.2 VAE's for TI2V-5B's 48, else Wan 2.1's."""
    return LATENT_22 if channels == TI2V_CHANNELS else LATENT


def latent_frames(frames: int) -> int:
    """Latent frames of a clip of `frames` (1 + 4k) frames."""
    return (frames - 1) // TEMPORAL + 1


FAMILY = FamilyInfo(
    id="wan",
    title="Wan",
    latent=LATENT,
    recognise=recognise,
    splits=True,  # one clip's tokens across a GPU group (workers/parallel/split_family.py)
    activation_gb=2.0,
    activation_gb_per_mpx=0.5,  # per frame: routing multiplies the megapixels by the frames
    nodes=("nodes",),
    guidance="cfg",
    text_encoders=("UMT5",),
    cfg_offset=0.0,  # the pipeline's guidance_scale is ComfyUI's cfg
    video=True,
    variant=variant,
    # TI2V-5B: (H/32)·(W/32) tokens per latent frame where the A14B models have (H/16)·(W/16)
    variant_activation=(("ti2v", 0.25),),
)
