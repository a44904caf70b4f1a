"""Wan's transformer in its original key layout, as ComfyUI ships Wan (`blocks.N.self_attn.q`,
`text_embedding.0`, `head.head`, `blocks.N.modulation`; ComfyUI adds `model.diffusion_model.`
when it saves). Reading it is diffusers' own `convert_wan_transformer_to_diffusers`
(`from_original`); `to_original` is its inverse for a T2V / I2V transformer without image
embedder, for the tiny stack and the test that checks it against diffusers' converter.
"""

from __future__ import annotations

from typing import Any

# diffusers' name part → the original's, applied in order (the converter's table, inverted;
# the norms swap: diffusers' norm2 is the cross-attention norm, the original's norm3)
TO_ORIGINAL: tuple[tuple[str, str], ...] = (
    ("condition_embedder.time_embedder.linear_1", "time_embedding.0"),
    ("condition_embedder.time_embedder.linear_2", "time_embedding.2"),
    ("condition_embedder.text_embedder.linear_1", "text_embedding.0"),
    ("condition_embedder.text_embedder.linear_2", "text_embedding.2"),
    ("condition_embedder.time_proj", "time_projection.1"),
    (".attn2.", ".cross_attn."), (".attn1.", ".self_attn."),
    (".to_out.0.", ".o."), (".to_q.", ".q."), (".to_k.", ".k."), (".to_v.", ".v."),
    ("ffn.net.0.proj", "ffn.0"), ("ffn.net.2", "ffn.2"),
    (".norm2.", ".norm__placeholder."), (".norm3.", ".norm2."), (".norm__placeholder.", ".norm3."),
)


def is_original(keys: Any) -> bool:
    return any(k.startswith("text_embedding.") for k in keys)


def from_original(state: dict[str, Any]) -> dict[str, Any]:
    """Original / ComfyUI keys → WanTransformer3DModel's (diffusers' converter)."""
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    return convert_wan_transformer_to_diffusers(dict(state))


def to_original(state: dict[str, Any]) -> dict[str, Any]:
    """WanTransformer3DModel's keys → the original layout (what from_original reads)."""
    return {_original(key): value.contiguous() for key, value in state.items()}


def _original(key: str) -> str:
    if key == "scale_shift_table":
        return "head.modulation"
    if key.startswith("proj_out."):
        return "head.head." + key.removeprefix("proj_out.")
    if key.startswith("blocks.") and key.endswith(".scale_shift_table"):
        return key.removesuffix("scale_shift_table") + "modulation"
    for new, old in TO_ORIGINAL:
        key = key.replace(new, old)
    return key
