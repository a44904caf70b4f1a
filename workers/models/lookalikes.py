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
