"""Qwen-Image's VAE in its original (Wan 2.1) key layout, as ComfyUI ships `qwen_image_vae`:
`encoder.conv1`, `encoder.downsamples.N.residual.{0,2,3,6}`, `encoder.middle.{0,1,2}`,
`encoder.head.{0,2}`, `conv1` / `conv2` (the quant convs), `decoder.upsamples.N` (four resnets
and upsamplers per stage, flattened). Reading it is diffusers' own `convert_wan_vae_to_diffusers`
(`from_original`); `to_original` is its inverse, for the tiny stack and the tests that check it
against diffusers' converter. The layout holds for Qwen-Image's geometry (2 res blocks per stage,
as the full-size VAE and the tiny stack have).
"""

from __future__ import annotations

import re
from typing import Any

RESNET = {"norm1.gamma": "residual.0.gamma", "conv1.": "residual.2.", "norm2.gamma": "residual.3.gamma",
          "conv2.": "residual.6.", "conv_shortcut.": "shortcut."}
TOP = {"encoder.conv_in.": "encoder.conv1.", "decoder.conv_in.": "decoder.conv1.",
       "quant_conv.": "conv1.", "post_quant_conv.": "conv2.",
       "encoder.norm_out.": "encoder.head.0.", "encoder.conv_out.": "encoder.head.2.",
       "decoder.norm_out.": "decoder.head.0.", "decoder.conv_out.": "decoder.head.2."}
DECODER_STAGE = 4  # original decoder.upsamples per up block: 3 resnets and its upsampler


def is_original(keys: Any) -> bool:
    return any(k.startswith(("decoder.conv1.", "decoder.upsamples.")) for k in keys)


def from_original(state: dict[str, Any]) -> dict[str, Any]:
    """Original / ComfyUI keys → AutoencoderKLQwenImage's (diffusers' converter)."""
    from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers

    return convert_wan_vae_to_diffusers(state)


def to_original(state: dict[str, Any]) -> dict[str, Any]:
    """AutoencoderKLQwenImage's keys → the original layout (what from_original reads)."""
    return {_original(key): value.contiguous() for key, value in state.items()}


def _original(key: str) -> str:
    for new, old in TOP.items():
        if key.startswith(new):
            return old + key[len(new):]
    if m := re.match(r"(encoder|decoder)\.mid_block\.(resnets|attentions)\.(\d)\.(.*)", key):
        side, kind, index, rest = m.groups()
        slot = 1 if kind == "attentions" else 2 * int(index)  # middle: resnet, attention, resnet
        return f"{side}.middle.{slot}.{_resnet(rest) if kind == 'resnets' else rest}"
    if m := re.match(r"encoder\.down_blocks\.(\d+)\.(.*)", key):
        return f"encoder.downsamples.{m[1]}.{_resnet(m[2])}"
    if m := re.match(r"decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\.(.*)", key):
        return f"decoder.upsamples.{DECODER_STAGE * int(m[1]) + int(m[2])}.{_resnet(m[3])}"
    if m := re.match(r"decoder\.up_blocks\.(\d+)\.upsamplers\.0\.(.*)", key):
        return f"decoder.upsamples.{DECODER_STAGE * int(m[1]) + 3}.{m[2]}"
    return key


def _resnet(rest: str) -> str:
    for new, old in RESNET.items():
        if rest.startswith(new):
            return old + rest[len(new):]
    return rest
