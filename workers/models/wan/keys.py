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


# The Wan 2.2 VAE (TI2V-5B's, ComfyUI's `wan2.2_vae.safetensors`, the original
# `Wan2.2_VAE.pth`) in its original keys: diffusers' converter for it lives only in its
# scripts/convert_wan_to_diffusers.py (`convert_vae_22`), not in the wheel; this is the same
# mapping, part by part. Its blocks nest (`encoder.downsamples.X.downsamples.Y`), the resampler
# comes after the block's residual blocks and loses its index in diffusers' layout.
VAE22_PARTS: tuple[tuple[str, str], ...] = (  # the original's → diffusers' (whole dotted parts)
    ("residual.0.gamma", "norm1.gamma"), ("residual.2", "conv1"),
    ("residual.3.gamma", "norm2.gamma"), ("residual.6", "conv2"), ("shortcut", "conv_shortcut"),
    ("head.0", "norm_out"), ("head.2", "conv_out"))
_VAE22_BLOCKS = {"encoder": ("downsamples", "down_blocks", "downsampler"),
                 "decoder": ("upsamples", "up_blocks", "upsampler")}


def vae22_from_original(state: dict[str, Any]) -> dict[str, Any]:
    """The Wan 2.2 VAE's original / ComfyUI keys → AutoencoderKLWan's (`convert_vae_22`)."""
    return {_vae22_diffusers(key): value for key, value in state.items()}


def _vae22_diffusers(key: str) -> str:
    if key.split(".")[0] in ("conv1", "conv2"):
        return ("quant_conv." if key.startswith("conv1.") else "post_quant_conv.") + key[6:]
    side, rest = key.split(".", 1)
    old, blocks, sampler = _VAE22_BLOCKS.get(side, ("", "", ""))
    if rest.startswith("conv1."):
        rest = "conv_in." + rest.removeprefix("conv1.")
    elif rest.startswith("middle."):
        index, tail = rest.removeprefix("middle.").split(".", 1)
        rest = (f"mid_block.attentions.0.{tail}" if index == "1"
                else f"mid_block.resnets.{int(index) // 2}.{tail}")
    elif old and rest.startswith(old + "."):
        block, _, index, tail = rest.removeprefix(old + ".").split(".", 3)
        rest = (f"{blocks}.{block}.resnets.{index}.{tail}"
                if tail.startswith(("residual", "shortcut")) else f"{blocks}.{block}.{sampler}.{tail}")
    for original, diffusers_part in VAE22_PARTS:
        rest = _swap_part(rest, original, diffusers_part)
    return f"{side}.{rest}"


def vae22_to_original(state: dict[str, Any]) -> dict[str, Any]:
    """AutoencoderKLWan 2.2's keys → the original layout (what vae22_from_original reads): the
    resampler's index is its block's residual-block count."""
    resnets: dict[str, set[str]] = {}
    for key in state:
        parts = key.split(".")
        if len(parts) > 4 and parts[1] in ("down_blocks", "up_blocks") and parts[3] == "resnets":
            resnets.setdefault(".".join(parts[:3]), set()).add(parts[4])
    return {_vae22_original(key, resnets): value.contiguous() for key, value in state.items()}


def _vae22_original(key: str, resnets: dict[str, set[str]]) -> str:
    if key.split(".")[0] in ("quant_conv", "post_quant_conv"):
        return ("conv1." if key.startswith("quant_conv.") else "conv2.") + key.split(".", 1)[1]
    side, rest = key.split(".", 1)
    old, blocks, sampler = _VAE22_BLOCKS[side]
    for original, diffusers_part in VAE22_PARTS:
        rest = _swap_part(rest, diffusers_part, original)
    if rest.startswith("conv_in."):
        rest = "conv1." + rest.removeprefix("conv_in.")
    elif rest.startswith("mid_block."):
        kind, index, tail = rest.removeprefix("mid_block.").split(".", 2)
        rest = f"middle.{1 if kind == 'attentions' else 2 * int(index)}.{tail}"
    elif rest.startswith(blocks + "."):
        block, kind, tail = rest.removeprefix(blocks + ".").split(".", 2)
        if kind == sampler:
            rest = f"{old}.{block}.{old}.{len(resnets[f'{side}.{blocks}.{block}'])}.{tail}"
        else:
            rest = f"{old}.{block}.{old}.{tail}"
    return f"{side}.{rest}"


def _swap_part(key: str, old: str, new: str) -> str:
    """`old` replaced by `new` where it is whole dotted parts of `key`."""
    padded = f".{key}."
    return padded.replace(f".{old}.", f".{new}.")[1:-1]
