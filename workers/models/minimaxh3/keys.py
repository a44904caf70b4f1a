"""MiniMax-H3's transformer in ComfyUI's single-file keys (Comfy-Org/MiniMax-H3's layout:
`blocks.N.attn.qkv_proj` stacked [q; k; v], `mlp.fc1` fused [gate; value], `video_patch_proj`,
`token_refiner.blocks.`, with or without `model.diffusion_model.`). Reading goes through diffusers'
own converter; `to_original` is its inverse (the tiny stack's file). TORCH-FREE at import."""

from __future__ import annotations

from typing import Any

PREFIX = "model.diffusion_model."
# what identifies ComfyUI's file (diffusers' CHECKPOINT_KEY_NAMES["minimax-h3"])
MARKER = "token_refiner.blocks.0.attn.qkv_proj.weight"
# ComfyUI's quantized layers (its int8 "convrot" / fp8 scaled / nvfp4 files) and the pruned
# transformer's precomputed modulation table (the shipped fl2va file)
QUANTIZED = (".weight_scale", ".comfy_quant", ".scale_weight", ".input_scale", ".weight_scale_2")
PRUNED = "adaln_t_table"
# diffusers' name → ComfyUI's (the converter's renames, reversed; order matters)
_RENAMES = (
    ("token_refiner.refiner_blocks.", "token_refiner.blocks."),
    ("time_embedder.linear_1.", "time_embedder.proj_in."),
    ("time_embedder.linear_2.", "time_embedder.proj_out."),
    ("audio_proj_in.", "audio_patch_proj."),
    ("context_embedder.", "condition_proj."),
    ("norm_out.norm.", "final_layer.norm."),
    ("norm_out.linear.", "final_layer.adaln_proj.linear."),
    ("audio_proj_out.", "final_layer.audio_out."),
    (".attn.norm_q.", ".attn.q_norm."),
    (".attn.norm_k.", ".attn.k_norm."),
    (".attn.to_out.0.", ".attn.out_proj."),
    (".ff.net.0.proj.", ".mlp.fc1."),
    (".ff.net.2.", ".mlp.fc2."),
)


def to_diffusers(state: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """ComfyUI's keys (any prefix) → MiniMaxH3Transformer3DModel's state dict."""
    from diffusers.loaders.single_file_utils import (
        convert_minimax_h3_transformer_checkpoint_to_diffusers,
    )

    bare = {k.removeprefix(PREFIX): v for k, v in state.items()}
    return convert_minimax_h3_transformer_checkpoint_to_diffusers(bare, config)


def to_original(state: dict[str, Any]) -> dict[str, Any]:
    """MiniMaxH3Transformer3DModel's state dict → ComfyUI's keys (prefixed)."""
    import torch

    out: dict[str, Any] = {}
    for key, value in state.items():
        if key.endswith((".attn.to_k.weight", ".attn.to_v.weight")):
            continue
        if key.endswith(".attn.to_q.weight"):
            base = key.removesuffix("to_q.weight")
            value = torch.cat([state[base + "to_q.weight"], state[base + "to_k.weight"],
                               state[base + "to_v.weight"]])
            key = base + "qkv_proj.weight"
        elif key.endswith(".ff.net.0.proj.weight"):
            first, second = torch.chunk(value, 2, dim=0)  # SwiGLU's [value; gate] → [gate; value]
            value = torch.cat([second, first])
        if key.startswith("transformer_blocks."):
            key = "blocks." + key.removeprefix("transformer_blocks.")
        elif key.startswith("proj_in."):
            key = "video_patch_proj." + key.removeprefix("proj_in.")
        elif key.startswith("proj_out."):
            key = "final_layer.video_out." + key.removeprefix("proj_out.")
        for ours, theirs in _RENAMES:
            key = key.replace(ours, theirs)
        out[PREFIX + key] = value.contiguous()
    return out
