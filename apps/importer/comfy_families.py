"""Which model family a ComfyUI workflow needs, and what its family-bound nodes become.
TORCH-FREE.

The evidence, strongest first:
- a model file the fleet holds: the family that recognises its contents (the catalog's
  `families`, workers/models/families.py `identify`);
- a text-encoder loader's `type` widget (`CLIP_TYPES`: ComfyUI builds that family's encoder),
  and loaders that exist for one family only (`TripleCLIPLoader`: SD3);
- node types that exist for one family only (`FAMILY_NODES`: `WanImageToVideo`,
  `TextEncodeQwenImageEdit`, `LTXV*`, …). Shared nodes say nothing: `EmptySD3LatentImage`
  (any 16-channel latent: Z-Image's and FLUX.1's templates use it), `EmptyHunyuanLatentVideo`
  (HunyuanVideo's and Wan's templates), `FluxGuidance` and
  `ModelSamplingFlux` (FLUX.1, FLUX.2, Chroma), `ModelSamplingSD3` (SD3, Wan, Qwen-Image).
A workflow whose evidence names a family that is not registered on this farm is refused
(`unsupported_family`, naming the node) before anything reaches a worker.

Family ids: ours are workers/models/families.py `REGISTERED`; the others are named here as
apps/graphs/families.py `FAMILY_IDS` names those still to come (`wan`, …).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# ComfyUI's CLIPLoader / DualCLIPLoader `type` → the family whose text encoder it builds.
# `lumina2` is the type ComfyUI's Z-Image templates load Qwen3-4B with (Lumina 2's own Gemma
# loads as it too; a held file's contents decide between them); `stable_diffusion` is SD1.x's
# and SDXL's CLIP alike, so it says nothing.
CLIP_TYPES: dict[str, str] = {
    "lumina2": "zimage", "flux": "flux1", "sdxl": "sdxl", "sd3": "sd3",
    "qwen_image": "qwenimage", "wan": "wan", "hidream": "hidream", "ltxv": "ltxv",
    "hunyuan_video": "hunyuan-video", "hunyuan_video_15": "hunyuan-video",
    "hunyuan_image": "hunyuan-image", "chroma": "chroma", "stable_cascade": "stable-cascade",
    "stable_audio": "stable-audio", "mochi": "mochi", "pixart": "pixart", "cosmos": "cosmos",
    "ace": "ace-step", "omnigen2": "omnigen2", "flux2": "flux2", "ovis": "ovis",
    "kandinsky5": "kandinsky5", "kandinsky5_image": "kandinsky5", "hunyuan_dit": "hunyuan-dit",
    "krea2": "krea2",  # Qwen3-VL-4B, Krea 2's encoder (ComfyUI's CLIPType.KREA2)
    "minimax": "minimaxh3",  # MiniMax-H3's Qwen3-VL-32B
}
CLIP_TYPE_LOADERS = frozenset({"CLIPLoader", "DualCLIPLoader"})

# Node types that exist for one family only (exact names, then prefixes).
FAMILY_NODES: dict[str, str] = {
    "TripleCLIPLoader": "sd3", "CLIPTextEncodeSD3": "sd3",
    "QuadrupleCLIPLoader": "hidream", "CLIPTextEncodeHiDream": "hidream",
    "CLIPTextEncodeSDXL": "sdxl", "CLIPTextEncodeSDXLRefiner": "sdxl",
    "HunyuanImageToVideo": "hunyuan-video",
    "TextEncodeHunyuanVideo_ImageToVideo": "hunyuan-video",
    "EmptyHunyuanImageLatent": "hunyuan-image", "CLIPTextEncodeHunyuanDiT": "hunyuan-dit",
    "EmptyMochiLatentVideo": "mochi", "EmptyCosmosLatentVideo": "cosmos",
    "EmptyLTXVLatentVideo": "ltxv", "EmptyAceStepLatentAudio": "ace-step",
    "TextEncodeAceStepAudio": "ace-step", "EmptyLatentAudio": "stable-audio",
    "ConditioningStableAudio": "stable-audio", "CLIPTextEncodePixArtAlpha": "pixart",
    "EmptyFlux2LatentImage": "flux2", "Flux2Scheduler": "flux2",
    "EmptyChromaRadianceLatentImage": "chroma-radiance",
    "EmptyQwenImageLayeredLatentImage": "qwenimage",
    "TextEncodeQwenImage21": "qwenimage21", "QwenImage21Cache": "qwenimage21",
    "MiniMaxH3ImageToVideo": "minimaxh3",
    "MiniMaxH3ReferenceToVideo": "minimaxh3",
    # LTX-2's audio nodes; the LTXV nodes it shares with LTX-Video 0.9 say `ltxv`, which an
    # LTX-2 workflow (one with these) reads as ltx2 (api_format `_families_check`)
    **dict.fromkeys(("LTXVEmptyLatentAudio", "LTXVConcatAVLatent", "LTXVSeparateAVLatent",
                     "LTXVAudioVAELoader", "LTXVAudioVAEDecode", "LTXVAudioVAEEncode",
                     "LTXAVTextEncoderLoader"), "ltx2"),
}
FAMILY_NODE_PREFIXES: tuple[tuple[str, str], ...] = (
    ("Wan", "wan"), ("TextEncodeQwenImage", "qwenimage"), ("QwenImage", "qwenimage"),
    ("LTXV", "ltxv"), ("StableCascade_", "stable-cascade"), ("Cosmos", "cosmos"),
    ("HunyuanVideo15", "hunyuan-video"), ("Kandinsky5", "kandinsky5"),
)

# Loaders: their file widgets (widget → models folder); a held file's contents say its family.
LOADER_FILES: dict[str, tuple[tuple[str, str], ...]] = {
    "UNETLoader": (("unet_name", "diffusion_models"),),
    "CLIPLoader": (("clip_name", "text_encoders"),),
    "DualCLIPLoader": (("clip_name1", "text_encoders"), ("clip_name2", "text_encoders")),
    "TripleCLIPLoader": (("clip_name1", "text_encoders"), ("clip_name2", "text_encoders"),
                         ("clip_name3", "text_encoders")),
    "VAELoader": (("vae_name", "vae"),),
    "CheckpointLoaderSimple": (("ckpt_name", "checkpoints"),),
    "LTXAVTextEncoderLoader": (("ckpt_name", "checkpoints"),),
    "LTXVAudioVAELoader": (("ckpt_name", "checkpoints"),),
}

# Nodes whose effect becomes a param of the sampler downstream: (the input they pass on, param).
SAMPLER_PARAM_NODES: dict[str, tuple[str, str]] = {
    "FluxGuidance": ("conditioning", "guidance"),
    "ModelSamplingSD3": ("model", "shift"),
    "ModelSamplingAuraFlow": ("model", "shift"),
    "ModelSamplingFlux": ("model", "shift"),
}
FLUX_DEFAULT_GUIDANCE = 3.5  # a FLUX.1 conditioning's guidance when no FluxGuidance sets one


@dataclass(frozen=True)
class Evidence:
    """Node `node_id` (`comfy_type`) says the workflow needs one of `families`, because `why`."""

    node_id: str
    comfy_type: str
    families: tuple[str, ...]
    why: str


def node_family(comfy_type: str) -> str | None:
    """The one family a node type exists for, else None."""
    if comfy_type in FAMILY_NODES:
        return FAMILY_NODES[comfy_type]
    for prefix, family in FAMILY_NODE_PREFIXES:
        if comfy_type.startswith(prefix):
            return family
    return None


def known_family_node(comfy_type: str) -> bool:
    return node_family(comfy_type) is not None


def loader_evidence(node_id: str, comfy_type: str, inputs: dict[str, Any],
                    families_of: Callable[[str, str], tuple[str, ...] | None]) -> Evidence | None:
    """What a loader (or any node) says: its held files' families (contents), else its `type`
    widget, else the one family its type exists for. `families_of(folder, name)`: the families
    that recognise a held file (empty when none does), None when no worker holds it. A held
    safetensors file no family recognises is evidence of a family the farm does not run (no
    families at all)."""
    common: tuple[str, ...] | None = None
    names = []
    for widget, folder in LOADER_FILES.get(comfy_type, ()):
        name = inputs.get(widget)
        families = families_of(folder, name) if isinstance(name, str) else None
        if families == () and isinstance(name, str) and name.lower().endswith(
                (".safetensors", ".sft")):
            return Evidence(node_id, comfy_type, (), f"no model family this farm runs "
                            f"recognises the weights of {folder}/{name}")
        if families:
            names.append(f"{folder}/{name}")
            common = families if common is None else tuple(f for f in common if f in families)
    if common:
        return Evidence(node_id, comfy_type, common,
                        f"the weights of {' + '.join(names)} are {' / '.join(common)}'s")
    clip_type = inputs.get("type") if comfy_type in CLIP_TYPE_LOADERS else None
    if isinstance(clip_type, str) and clip_type in CLIP_TYPES:
        return Evidence(node_id, comfy_type, (CLIP_TYPES[clip_type],),
                        f"its type {clip_type!r} loads {CLIP_TYPES[clip_type]}'s text encoder")
    family = node_family(comfy_type)
    if family is not None:
        return Evidence(node_id, comfy_type, (family,), f"{comfy_type} exists for {family} only")
    return None


def flux_shift(max_shift: float, base_shift: float, width: float, height: float) -> float:
    """ComfyUI's ModelSamplingFlux as the farm's `shift` α. ComfyUI computes
    mu = (width·height / 256)·m + b on the line through (256, base_shift) and
    (4096, max_shift), and samples σ = e^mu / (e^mu + 1/t − 1), which is
    α·t / (1 + (α − 1)·t) for α = e^mu."""
    x1, x2 = 256, 4096
    mm = (max_shift - base_shift) / (x2 - x1)
    b = base_shift - mm * x1
    mu = (width * height / (8 * 8 * 2 * 2)) * mm + b
    return math.exp(mu)
