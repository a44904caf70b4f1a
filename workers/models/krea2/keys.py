"""Krea 2's transformer in its original key layout, as ComfyUI ships it (`first.`, `tmlp.`,
`tproj.1.`, `txtmlp.`, `txtfusion.`, `blocks.N.attn.wq` / `.qknorm.qnorm.scale` / `.mod.lin`
flattened, `last.`), with or without `model.diffusion_model.`. Reading it is diffusers' own
`convert_krea2_transformer_checkpoint_to_diffusers` (`from_original`); `to_original` is its
inverse, for the tiny stack and the test that checks it against diffusers' converter."""

from __future__ import annotations

from typing import Any

# diffusers' prefix → the original's (the converter's prefix_rename_dict, reversed)
PREFIXES = {
    "img_in.": "first.", "time_embed.linear_1.": "tmlp.0.", "time_embed.linear_2.": "tmlp.2.",
    "time_mod_proj.": "tproj.1.", "txt_in.norm.weight": "txtmlp.0.scale",
    "txt_in.linear_1.": "txtmlp.1.", "txt_in.linear_2.": "txtmlp.3.",
    "text_fusion.": "txtfusion.", "transformer_blocks.": "blocks.",
    "final_layer.linear.": "last.linear.", "final_layer.norm.weight": "last.norm.scale",
    "final_layer.scale_shift_table": "last.modulation.lin",
}
# inside a block (the converter's block_rename_dict, reversed)
PARTS = {
    ".attn.to_q.": ".attn.wq.", ".attn.to_k.": ".attn.wk.", ".attn.to_v.": ".attn.wv.",
    ".attn.to_out.0.": ".attn.wo.", ".attn.to_gate.": ".attn.gate.",
    ".attn.norm_q.weight": ".attn.qknorm.qnorm.scale",
    ".attn.norm_k.weight": ".attn.qknorm.knorm.scale", ".ff.": ".mlp.",
    ".norm1.weight": ".prenorm.scale", ".norm2.weight": ".postnorm.scale",
    ".scale_shift_table": ".mod.lin",
}


def is_original(keys: Any) -> bool:
    return any(k.removeprefix("model.diffusion_model.").startswith(("txtfusion.", "blocks.", "first."))
               for k in keys)


def from_original(state: dict[str, Any]) -> dict[str, Any]:
    """Original / ComfyUI keys → Krea2Transformer2DModel's (diffusers' converter)."""
    from diffusers.loaders.single_file_utils import (
        convert_krea2_transformer_checkpoint_to_diffusers,
    )

    return dict(convert_krea2_transformer_checkpoint_to_diffusers(dict(state)))


def to_original(state: dict[str, Any]) -> dict[str, Any]:
    """Krea2Transformer2DModel's keys → the original layout (each block's [6, D] modulation
    table flattened, as the original stores it)."""
    out: dict[str, Any] = {}
    for key, value in state.items():
        new = key
        for ours, theirs in PREFIXES.items():
            if new.startswith(ours):
                new = theirs + new[len(ours):]
                break
        if new != key and not new.startswith("last."):
            for ours, theirs in PARTS.items():
                new = new.replace(ours, theirs)
        if key.startswith("transformer_blocks.") and key.endswith(".scale_shift_table"):
            value = value.reshape(-1)
        out[new] = value
    return out
