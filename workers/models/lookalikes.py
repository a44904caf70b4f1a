"""Marks that tell apart the files of families whose key names overlap. TORCH-FREE.

FLUX.2 kept FLUX.1's `double_blocks.*.img_attn` names and LoRA module names, so FLUX.1's
`recognise` must refuse FLUX.2's files; both families read these marks from here (a family
package never imports another's)."""

from __future__ import annotations

from workers.models.header import ModelHeader


def is_flux2_lora(header: ModelHeader) -> bool:
    """A LoRA of FLUX.2's transformer in diffusers / PEFT names: its modules FLUX.1 lacks (the
    single blocks' fused `to_qkv_mlp_proj`, the SwiGLU `linear_in` / `linear_out`)."""
    return any(header.has(f) for f in ("to_qkv_mlp_proj", "ff.linear_in", "ff.linear_out",
                                        "ff_context.linear_in", "ff_context.linear_out"))


def is_flux2_transformer(header: ModelHeader) -> bool:
    """A FLUX.2 transformer, in any layout (its shared `*_stream_modulation` layers)."""
    return header.class_name == "Flux2Transformer2DModel" or header.has("single_stream_modulation.")


QWEN3_VL = ("Qwen3VLModel", "Qwen3VLForConditionalGeneration")


def is_qwen3_vl(header: ModelHeader) -> bool:
    """A Qwen3-VL (Krea 2's text encoder): per-head q_norm like Qwen3 (Z-Image's, FLUX.2
    Klein's), with its `visual.` tower or under `language_model.` (Gemma 3's `vision_tower` and
    `pre_feedforward_layernorm` excluded); Qwen2.5-VL has no q_norm."""
    if header.class_name in QWEN3_VL or header.config.get("model_type") == "qwen3_vl":
        return True
    if not header.has("self_attn.q_norm.") or header.has("pre_feedforward_layernorm"):
        return False
    return header.has("visual.") or (header.has("language_model.")
                                     and not header.has("vision_tower."))
