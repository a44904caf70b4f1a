"""Diffusers' SDXL state dicts → the original (Stability / ComfyUI) single-file layout, the
inverse of diffusers' own converters (diffusers.loaders.single_file_utils
`convert_ldm_unet_checkpoint`, `convert_ldm_vae_checkpoint`, `convert_ldm_clip_checkpoint`,
`convert_open_clip_checkpoint`). Only the tiny stack writer needs this direction: loading goes
through diffusers' converters, so a tiny checkpoint is read by the code real ones are.
tests/workers/test_sdxl.py checks each inverse against diffusers' converter.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from workers.models.sdxl import BIG_G, UNET

CLIP_L = "conditioner.embedders.0.transformer."
VAE = "first_stage_model."

_UNET_FIXED = {
    "time_embedding.linear_1": "time_embed.0", "time_embedding.linear_2": "time_embed.2",
    "add_embedding.linear_1": "label_emb.0.0", "add_embedding.linear_2": "label_emb.0.2",
    "conv_in": "input_blocks.0.0", "conv_norm_out": "out.0", "conv_out": "out.2",
}
_UNET_RESNET = {"norm1": "in_layers.0", "conv1": "in_layers.2", "norm2": "out_layers.0",
                "conv2": "out_layers.3", "time_emb_proj": "emb_layers.1",
                "conv_shortcut": "skip_connection"}
_VAE_ATTENTION = {"group_norm": "norm", "to_q": "q", "to_k": "k", "to_v": "v",
                  "to_out.0": "proj_out"}


def checkpoint(unet: Any, vae: Any, clip_l: Any, big_g: Any) -> dict[str, torch.Tensor]:
    """One all-in-one checkpoint's state dict from the four diffusers / transformers modules."""
    state = {UNET + k: v for k, v in unet_to_original(unet.state_dict(), unet.config).items()}
    state |= {VAE + k: v for k, v in vae_to_original(vae.state_dict(), vae.config).items()}
    state |= {CLIP_L + k: v for k, v in clip_to_original(clip_l.state_dict()).items()}
    state |= {BIG_G + k: v for k, v in open_clip_to_original(big_g.state_dict()).items()}
    return {k: v.contiguous() for k, v in state.items()}


def unet_to_original(state: dict[str, Any], config: Any) -> dict[str, Any]:
    """UNet2DConditionModel keys → `input_blocks` / `middle_block` / `output_blocks` keys."""
    per_block = int(config["layers_per_block"]) + 1  # resnets (+ a down/upsampler) per level
    attended = {int(k.split(".")[1]) for k in state if re.match(r"up_blocks\.\d+\.attentions", k)}

    def rename(key: str) -> str:
        head, _, leaf = key.rpartition(".")
        if head in _UNET_FIXED:
            return f"{_UNET_FIXED[head]}.{leaf}"
        if m := re.fullmatch(r"down_blocks\.(\d+)\.(resnets|attentions)\.(\d+)\.(.+)", key):
            i, kind, j, rest = int(m[1]), m[2], int(m[3]), m[4]
            return f"input_blocks.{i * per_block + j + 1}.{_part(kind, rest)}"
        if m := re.fullmatch(r"down_blocks\.(\d+)\.downsamplers\.0\.conv\.(.+)", key):
            return f"input_blocks.{(int(m[1]) + 1) * per_block}.0.op.{m[2]}"
        if m := re.fullmatch(r"mid_block\.resnets\.(\d+)\.(.+)", key):
            return f"middle_block.{2 * int(m[1])}.{_resnet(m[2])}"
        if m := re.fullmatch(r"mid_block\.attentions\.0\.(.+)", key):
            return f"middle_block.1.{m[1]}"
        if m := re.fullmatch(r"up_blocks\.(\d+)\.(resnets|attentions)\.(\d+)\.(.+)", key):
            i, kind, j, rest = int(m[1]), m[2], int(m[3]), m[4]
            return f"output_blocks.{i * per_block + j}.{_part(kind, rest)}"
        if m := re.fullmatch(r"up_blocks\.(\d+)\.upsamplers\.0\.conv\.(.+)", key):
            i = int(m[1])
            return f"output_blocks.{i * per_block + per_block - 1}.{2 if i in attended else 1}" \
                   f".conv.{m[2]}"
        raise ValueError(f"no original name for UNet key {key!r}")

    return {rename(k): v for k, v in state.items()}


def _part(kind: str, rest: str) -> str:
    return f"0.{_resnet(rest)}" if kind == "resnets" else f"1.{rest}"


def _resnet(rest: str) -> str:
    first, _, tail = rest.partition(".")
    return f"{_UNET_RESNET.get(first, first)}.{tail}"


def vae_to_original(state: dict[str, Any], config: Any) -> dict[str, Any]:
    """AutoencoderKL keys → `encoder.down.*` / `decoder.up.*` / `mid.*` keys; the mid
    attention's linear weights become the original 1×1 convolutions."""
    last = len(config["block_out_channels"]) - 1

    def rename(key: str) -> str:
        key = key.replace("conv_shortcut", "nin_shortcut").replace("conv_norm_out", "norm_out")
        if m := re.fullmatch(r"encoder\.down_blocks\.(\d+)\.resnets\.(.+)", key):
            return f"encoder.down.{m[1]}.block.{m[2]}"
        if m := re.fullmatch(r"encoder\.down_blocks\.(\d+)\.downsamplers\.0\.(.+)", key):
            return f"encoder.down.{m[1]}.downsample.{m[2]}"
        if m := re.fullmatch(r"decoder\.up_blocks\.(\d+)\.resnets\.(.+)", key):
            return f"decoder.up.{last - int(m[1])}.block.{m[2]}"
        if m := re.fullmatch(r"decoder\.up_blocks\.(\d+)\.upsamplers\.0\.(.+)", key):
            return f"decoder.up.{last - int(m[1])}.upsample.{m[2]}"
        if m := re.fullmatch(r"(encoder|decoder)\.mid_block\.resnets\.(\d+)\.(.+)", key):
            return f"{m[1]}.mid.block_{int(m[2]) + 1}.{m[3]}"
        if m := re.fullmatch(r"(encoder|decoder)\.mid_block\.attentions\.0\.(.+)\.(weight|bias)", key):
            return f"{m[1]}.mid.attn_1.{_VAE_ATTENTION[m[2]]}.{m[3]}"
        return key

    def value(key: str, tensor: Any) -> Any:
        attention = ".mid.attn_1." in key and key.split(".")[-2] != "norm"
        return tensor[:, :, None, None] if attention and tensor.ndim == 2 else tensor

    renamed = {rename(k): v for k, v in state.items()}
    return {k: value(k, v) for k, v in renamed.items()}


def clip_to_original(state: dict[str, Any]) -> dict[str, Any]:
    """CLIPTextModel keys → `text_model.*` (transformers' own names, as the original keeps them;
    newer transformers drop the `text_model.` level)."""
    return {(k if k.startswith("text_model.") else f"text_model.{k}"): v for k, v in state.items()
            if not k.endswith("position_ids")}


_OPEN_CLIP = (("text_model.encoder.layers.", "transformer.resblocks."), ("layer_norm1", "ln_1"),
              ("layer_norm2", "ln_2"), (".mlp.fc1.", ".mlp.c_fc."), (".mlp.fc2.", ".mlp.c_proj."),
              (".self_attn.", ".attn."))
_OPEN_CLIP_FIXED = {
    "text_model.embeddings.token_embedding.weight": "token_embedding.weight",
    "text_model.embeddings.position_embedding.weight": "positional_embedding",
    "text_model.final_layer_norm.weight": "ln_final.weight",
    "text_model.final_layer_norm.bias": "ln_final.bias",
}


def open_clip_to_original(state: dict[str, Any]) -> dict[str, Any]:
    """CLIPTextModelWithProjection keys → OpenCLIP's: q/k/v fused into `in_proj_*`, the text
    projection as a [width, projection] matrix (x @ P)."""
    out: dict[str, Any] = {}
    fused: dict[str, dict[str, Any]] = {}
    for key, tensor in state.items():
        key = key if key.startswith(("text_model.", "text_projection")) else f"text_model.{key}"
        if key.endswith("position_ids"):
            continue
        if key == "text_projection.weight":
            out["text_projection"] = tensor.T
        elif key in _OPEN_CLIP_FIXED:
            out[_OPEN_CLIP_FIXED[key]] = tensor
        elif m := re.fullmatch(r"(.+)\.self_attn\.([qkv])_proj\.(weight|bias)", key):
            fused.setdefault(f"{_open_clip_name(m[1])}.attn.in_proj_{m[3]}", {})[m[2]] = tensor
        else:
            out[_open_clip_name(key)] = tensor
    for key, parts in fused.items():
        out[key] = torch.cat([parts["q"], parts["k"], parts["v"]])
    return out


def _open_clip_name(key: str) -> str:
    for ours, theirs in _OPEN_CLIP:
        key = key.replace(ours, theirs)
    return key
