"""FLUX.1 transformer weights: the original / ComfyUI layout (`double_blocks.*`, fused `qkv`
and `linear1`, `model.diffusion_model.` prefix in ComfyUI files) ↔ diffusers'
`FluxTransformer2DModel` keys.

diffusers' own converter (`convert_flux_transformer_checkpoint_to_diffusers`) hard-codes the
full-size width (3072), so it cannot read a smaller model; these two functions are exact inverses
at any size (the single blocks' `linear1` is q, k, v and the 4× MLP: 7 parts of the width).
"""

from __future__ import annotations

import re

import torch

PREFIX = "model.diffusion_model."
# (diffusers name, original name): a key is `<name>.weight` / `<name>.bias`, unless the name
# already ends in one (RMSNorm weights are the original's `.scale`).
TOP = (
    ("time_text_embed.timestep_embedder.linear_1", "time_in.in_layer"),
    ("time_text_embed.timestep_embedder.linear_2", "time_in.out_layer"),
    ("time_text_embed.text_embedder.linear_1", "vector_in.in_layer"),
    ("time_text_embed.text_embedder.linear_2", "vector_in.out_layer"),
    ("time_text_embed.guidance_embedder.linear_1", "guidance_in.in_layer"),
    ("time_text_embed.guidance_embedder.linear_2", "guidance_in.out_layer"),
    ("context_embedder", "txt_in"),
    ("x_embedder", "img_in"),
    ("proj_out", "final_layer.linear"),
)
SWAPPED = ("norm_out.linear", "final_layer.adaLN_modulation.1")  # (scale, shift) ↔ (shift, scale)
DOUBLE = (
    ("norm1.linear", "img_mod.lin"),
    ("norm1_context.linear", "txt_mod.lin"),
    ("attn.norm_q.weight", "img_attn.norm.query_norm.scale"),
    ("attn.norm_k.weight", "img_attn.norm.key_norm.scale"),
    ("attn.norm_added_q.weight", "txt_attn.norm.query_norm.scale"),
    ("attn.norm_added_k.weight", "txt_attn.norm.key_norm.scale"),
    ("ff.net.0.proj", "img_mlp.0"),
    ("ff.net.2", "img_mlp.2"),
    ("ff_context.net.0.proj", "txt_mlp.0"),
    ("ff_context.net.2", "txt_mlp.2"),
    ("attn.to_out.0", "img_attn.proj"),
    ("attn.to_add_out", "txt_attn.proj"),
)
DOUBLE_FUSED = (
    (("attn.to_q", "attn.to_k", "attn.to_v"), "img_attn.qkv"),
    (("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"), "txt_attn.qkv"),
)
SINGLE = (
    ("norm.linear", "modulation.lin"),
    ("attn.norm_q.weight", "norm.query_norm.scale"),
    ("attn.norm_k.weight", "norm.key_norm.scale"),
    ("proj_out", "linear2"),
)
SINGLE_FUSED = (("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"), "linear1")
_BLOCK = re.compile(r"^(transformer_blocks|single_transformer_blocks|double_blocks|single_blocks)"
                    r"\.(\d+)\.(.+)$")
_ORIGINAL_BLOCK = {"transformer_blocks": "double_blocks", "single_transformer_blocks": "single_blocks"}


def _pairs(table: tuple[tuple[str, str], ...]) -> list[tuple[str, str]]:
    """Every (diffusers key, original key) of a rename table."""
    out = []
    for ours, theirs in table:
        if ours.endswith(".weight"):
            out.append((ours, theirs))
        else:
            out += [(f"{ours}.{p}", f"{theirs}.{p}") for p in ("weight", "bias")]
    return out


def _swap_halves(t: torch.Tensor) -> torch.Tensor:
    first, second = t.chunk(2, dim=0)
    return torch.cat([second, first], dim=0)


def to_original(state: dict[str, torch.Tensor], prefix: str = PREFIX) -> dict[str, torch.Tensor]:
    """Diffusers FluxTransformer2DModel keys → the original layout (with ComfyUI's prefix)."""
    out: dict[str, torch.Tensor] = {}
    blocks = sorted({(m[1], int(m[2])) for k in state if (m := _BLOCK.match(k))})
    for ours, theirs in _pairs(TOP):
        if ours in state:
            out[theirs] = state[ours]
    for ours, theirs in _pairs((SWAPPED,)):
        out[theirs] = _swap_halves(state[ours])
    for kind, i in blocks:
        here, there = f"{kind}.{i}.", f"{_ORIGINAL_BLOCK[kind]}.{i}."
        simple, fused = (DOUBLE, DOUBLE_FUSED) if kind == "transformer_blocks" else (
            SINGLE, (SINGLE_FUSED,))
        for ours, theirs in _pairs(simple):
            out[there + theirs] = state[here + ours]
        for parts, theirs in fused:
            for p in ("weight", "bias"):
                out[f"{there}{theirs}.{p}"] = torch.cat([state[f"{here}{q}.{p}"] for q in parts])
    return {prefix + k: v.contiguous() for k, v in out.items()}


def from_original(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The original / ComfyUI layout (prefix or not) → diffusers FluxTransformer2DModel keys."""
    state = {k.removeprefix(PREFIX): v for k, v in state.items()}
    out: dict[str, torch.Tensor] = {}
    for ours, theirs in _pairs(TOP):
        if theirs in state:
            out[ours] = state[theirs]
    for ours, theirs in _pairs((SWAPPED,)):
        if theirs in state:
            out[ours] = _swap_halves(state[theirs])
    blocks = sorted({(m[1], int(m[2])) for k in state if (m := _BLOCK.match(k))})
    for kind, i in blocks:
        here = f"{'transformer_blocks' if kind == 'double_blocks' else 'single_transformer_blocks'}.{i}."
        there = f"{kind}.{i}."
        simple, fused = (DOUBLE, DOUBLE_FUSED) if kind == "double_blocks" else (
            SINGLE, (SINGLE_FUSED,))
        for ours, theirs in _pairs(simple):
            if there + theirs in state:
                out[here + ours] = state[there + theirs]
        for parts, theirs in fused:
            for p in ("weight", "bias"):
                whole = state.get(f"{there}{theirs}.{p}")
                if whole is None:
                    continue
                unit = whole.shape[0] // (3 if len(parts) == 3 else 7)  # q, k, v (+ 4× MLP)
                sizes = [unit] * 3 + ([whole.shape[0] - 3 * unit] if len(parts) == 4 else [])
                for q, piece in zip(parts, torch.split(whole, sizes, dim=0), strict=True):
                    out[f"{here}{q}.{p}"] = piece
    return out


def is_original(keys: list[str]) -> bool:
    return any(k.removeprefix(PREFIX).startswith("double_blocks.") for k in keys)
