"""FLUX.1 (dev / schnell / Fill) through diffusers: the `flux1` model family. This module is
torch-free.

- `FAMILY` (here): the family's facts and how it recognises its files (workers/models/family.py).
- `plugin`: the contract's torch half; `loading`, `engine` (reproduces `FluxPipeline` /
  `FluxImg2ImgPipeline` / `FluxKontextPipeline` / `FluxFillPipeline` bit for bit on CPU),
  `edit` (Kontext's reference nodes), `keys` (the original / ComfyUI transformer layout),
  `nodes` (Fill's inpaint conditioning), `tiny` (a random-weight stack as studios lay FLUX.1
  out).
Files: the transformer (original `double_blocks.*` keys or diffusers'; Fill's reads 384
channels), CLIP-L and T5 text encoders (two files, either order), and the 16-channel FLUX VAE
(`ae`).
"""

from __future__ import annotations

from workers.models.family import FamilyInfo, LatentFormat
from workers.models.header import ModelHeader
from workers.models.lookalikes import is_flux2_lora, is_flux2_transformer

LATENT = LatentFormat(channels=16, downscale=8, patch=2)  # packed 2×2 into 64-wide tokens
CLIP_L_WIDTH = 768  # full-size CLIP-L; tiny stacks declare theirs in their config
# (width, height) FLUX.1 Kontext was trained at (FluxKontextPipeline's, ComfyUI's
# FluxKontextImageScale's list)
KONTEXT_RESOLUTIONS = (
    (672, 1568), (688, 1504), (720, 1456), (752, 1392), (800, 1328), (832, 1248), (880, 1184),
    (944, 1104), (1024, 1024), (1104, 944), (1184, 880), (1248, 832), (1328, 800), (1392, 752),
    (1456, 720), (1504, 688), (1568, 672),
)


def kontext_size(width: int, height: int) -> tuple[int, int]:
    """The preferred Kontext resolution (width, height) nearest an image's aspect ratio (ties:
    the narrower, as the pipeline's and ComfyUI's `min` over the list)."""
    aspect = width / height
    _, w, h = min((abs(aspect - w / h), w, h) for w, h in KONTEXT_RESOLUTIONS)
    return w, h


def recognise(header: ModelHeader) -> str | None:
    """lora: a LoRA of FLUX.1's transformer (is_flux_lora); transformer: double and single
    stream blocks (original or diffusers keys); vae: a
    16-channel AutoencoderKL; text_encoder: a CLIP text model without a second projection
    stack (CLIP-L) or a T5 encoder."""
    if header.is_lora():
        return "lora" if is_flux_lora(header) and not is_flux2_lora(header) else None
    name = header.class_name
    if is_flux2_transformer(header):
        return None  # FLUX.2's double blocks share FLUX.1's names (workers/models/lookalikes.py)
    if name == "FluxTransformer2DModel" or header.has("double_blocks.", "img_attn.") or (
        header.has("single_transformer_blocks.") and header.has("attn.add_q_proj.")
    ):
        return "transformer"
    if name == "AutoencoderKL" or header.has("decoder.conv_in.weight"):
        return "vae" if header.latent_channels() == 16 else None
    if clip_kind(header) == "clip-l" or t5_kind(header):
        return "text_encoder"
    return None


def is_flux_lora(header: ModelHeader) -> bool:
    """A LoRA of FLUX.1's transformer: kohya / ComfyUI (`double_blocks` / `single_blocks`),
    diffusers (`single_transformer_blocks`, or joint blocks with `add_q_proj`) or XLabs
    (`double_blocks.N.processor`) keys. Joint blocks with Qwen-Image's own modules (`img_mlp`,
    `txt_mod`, …) are Qwen-Image's; attention-only diffusers keys fit both families."""
    qwen = any(header.has("transformer_blocks.", part)
               for part in ("img_mlp", "txt_mlp", "img_mod", "txt_mod"))
    return (header.has("double_blocks") or header.has("single_blocks")
            or header.has("single_transformer_blocks.")
            or (header.has("transformer_blocks.", "add_q_proj") and not qwen))


def clip_kind(header: ModelHeader) -> str | None:
    """"clip-l" for a CLIP text model of CLIP-L's shape (no bigG: that is SDXL's second)."""
    if header.class_name in ("CLIPTextModel", "CLIPTextModelWithProjection"):
        width = header.config.get("hidden_size")
        return "clip-l" if width is None or width < 1280 else "clip-g"
    embed = header.shape("embeddings.token_embedding.weight")  # with or without text_model.
    if embed is None:
        return None
    return "clip-l" if embed[-1] < 1280 else "clip-g"


def t5_kind(header: ModelHeader) -> bool:
    """A T5 encoder; not UMT5 (Wan's), which has a relative attention bias in every block."""
    return header.class_name == "T5EncoderModel" or (
        header.has("encoder.block.0.layer.0.SelfAttention.")
        and (header.has("shared.weight") or header.has("encoder.embed_tokens.weight"))
        and not header.has("block.1.layer.0.SelfAttention.relative_attention_bias.")
    )


FAMILY = FamilyInfo(
    id="flux1",
    title="FLUX.1",
    latent=LATENT,
    recognise=recognise,
    splits=True,  # one image's tokens / CFG rows across a GPU group (workers/parallel/split_family.py)
    nodes=("edit", "nodes"),
    activation_gb=1.5,
    activation_gb_per_mpx=4.0,
    guidance="distilled",
    text_encoders=("CLIP-L", "T5"),
)
