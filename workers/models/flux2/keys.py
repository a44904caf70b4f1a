"""FLUX.2 transformer weights: the original / ComfyUI layout (`double_blocks.*`, fused `qkv`,
single blocks' fused `linear1`, shared `*_stream_modulation.lin`, `model.diffusion_model.`
prefix in ComfyUI files) ↔ diffusers' `Flux2Transformer2DModel` keys.

Reading uses diffusers' own converter (`convert_flux2_transformer_checkpoint_to_diffusers`, any
width: it cuts `qkv` in three); `to_original` is its inverse, for the tiny stack (a test proves
the round trip).
"""

from __future__ import annotations

import re

import torch

PREFIX = "model.diffusion_model."
# (diffusers name, original name); a key is `<name>.weight` (FLUX.2's linears have no bias),
# RMSNorm weights are the original's `.scale`.
TOP = (
    ("time_guidance_embed.timestep_embedder.linear_1.weight", "time_in.in_layer.weight"),
    ("time_guidance_embed.timestep_embedder.linear_2.weight", "time_in.out_layer.weight"),
    ("time_guidance_embed.guidance_embedder.linear_1.weight", "guidance_in.in_layer.weight"),
    ("time_guidance_embed.guidance_embedder.linear_2.weight", "guidance_in.out_layer.weight"),
    ("double_stream_modulation_img.linear.weight", "double_stream_modulation_img.lin.weight"),
    ("double_stream_modulation_txt.linear.weight", "double_stream_modulation_txt.lin.weight"),
    ("single_stream_modulation.linear.weight", "single_stream_modulation.lin.weight"),
    ("context_embedder.weight", "txt_in.weight"),
    ("x_embedder.weight", "img_in.weight"),
    ("proj_out.weight", "final_layer.linear.weight"),
)
SWAPPED = ("norm_out.linear.weight", "final_layer.adaLN_modulation.1.weight")  # (scale, shift) ↔
DOUBLE = (
    ("attn.norm_q.weight", "img_attn.norm.query_norm.scale"),
    ("attn.norm_k.weight", "img_attn.norm.key_norm.scale"),
    ("attn.norm_added_q.weight", "txt_attn.norm.query_norm.scale"),
    ("attn.norm_added_k.weight", "txt_attn.norm.key_norm.scale"),
    ("attn.to_out.0.weight", "img_attn.proj.weight"),
    ("attn.to_add_out.weight", "txt_attn.proj.weight"),
    ("ff.linear_in.weight", "img_mlp.0.weight"),
    ("ff.linear_out.weight", "img_mlp.2.weight"),
    ("ff_context.linear_in.weight", "txt_mlp.0.weight"),
    ("ff_context.linear_out.weight", "txt_mlp.2.weight"),
)
DOUBLE_FUSED = (
    (("attn.to_q.weight", "attn.to_k.weight", "attn.to_v.weight"), "img_attn.qkv.weight"),
    (("attn.add_q_proj.weight", "attn.add_k_proj.weight", "attn.add_v_proj.weight"),
     "txt_attn.qkv.weight"),
)
SINGLE = (
    ("attn.to_qkv_mlp_proj.weight", "linear1.weight"),
    ("attn.to_out.weight", "linear2.weight"),
    ("attn.norm_q.weight", "norm.query_norm.scale"),
    ("attn.norm_k.weight", "norm.key_norm.scale"),
)
_BLOCK = re.compile(r"^(transformer_blocks|single_transformer_blocks)\.(\d+)\.")


def to_original(state: dict[str, torch.Tensor], prefix: str = PREFIX) -> dict[str, torch.Tensor]:
    """Diffusers Flux2Transformer2DModel keys → the original layout (with ComfyUI's prefix)."""
    out = {theirs: state[ours] for ours, theirs in TOP if ours in state}
    first, second = state[SWAPPED[0]].chunk(2, dim=0)
    out[SWAPPED[1]] = torch.cat([second, first], dim=0)
    for kind, i in sorted({(m[1], int(m[2])) for k in state if (m := _BLOCK.match(k))}):
        here = f"{kind}.{i}."
        if kind == "transformer_blocks":
            there = f"double_blocks.{i}."
            out |= {there + theirs: state[here + ours] for ours, theirs in DOUBLE}
            for parts, theirs in DOUBLE_FUSED:
                out[there + theirs] = torch.cat([state[here + q] for q in parts])
        else:
            there = f"single_blocks.{i}."
            out |= {there + theirs: state[here + ours] for ours, theirs in SINGLE}
    return {prefix + k: v.contiguous() for k, v in out.items()}


def from_original(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The original / ComfyUI layout (prefix or not) → diffusers Flux2Transformer2DModel keys
    (diffusers' converter)."""
    from diffusers.loaders.single_file_utils import (
        convert_flux2_transformer_checkpoint_to_diffusers,
    )

    bare = {k.removeprefix(PREFIX): v for k, v in state.items()}
    return convert_flux2_transformer_checkpoint_to_diffusers(bare)


def is_original(keys: list[str]) -> bool:
    return any(k.removeprefix(PREFIX).startswith(("double_blocks.", "single_blocks.")) for k in keys)


BATCH_NORM = ("bn.running_mean", "bn.running_var", "bn.num_batches_tracked")


def vae_from_original(state: dict[str, torch.Tensor], config: dict) -> dict[str, torch.Tensor]:
    """The original (BFL / ComfyUI `ae`) AutoencoderKLFlux2 layout → diffusers' keys: its
    encoder / decoder / quant convs by diffusers' LDM converter, the latents' batch-norm
    statistics as they are."""
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint

    converted = convert_ldm_vae_checkpoint(state, config)
    return {**converted, **{k: state[k] for k in BATCH_NORM if k in state}}


def is_original_vae(keys: list[str]) -> bool:
    return any(k.startswith("encoder.down.") for k in keys)
