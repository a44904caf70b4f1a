"""LTX-2 from ComfyUI's separate component files, as the LTX-2.5 templates load it (UNETLoader,
two VAELoaders, CLIPLoader type ltxv): `ltx2/load-files`.

    diffusion_models/<x>.safetensors  the audio-video transformer in the original keys
                                      (`model.diffusion_model.` or bare), with the text
                                      connectors (`video_embeddings_connector.`, …) if it has them
    vae/<x>.safetensors               the video VAE (the all-in-one file's `vae.` keys, bare or not)
    vae/<x>.safetensors               the audio VAE + vocoder (`audio_vae.`, `vocoder.`)
    text_encoders/<x>.safetensors     the Gemma (ComfyUI's text-only `model.layers.*` or
                                      transformers' keys) with the connectors' projection
                                      (`text_embedding_projection.`: "with proj") and any
                                      connector blocks

Each file's `<stem>.diffusers/` beside it holds what the file does not: the diffusers configs of
the components it holds (an LTX2Pipeline folder's subset, `HOLDS`), and the connectors' config
beside the file with their projection (the text encoder's, else the diffusion model's). Together
the keys are the all-in-one file's (keys.from_original converts them). Nothing downloads: a
missing config or tokenizer is an error naming the folder to put it in.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from workers.models.family import ModelLoadError
from workers.models.ltx2 import keys

ROLES = ("diffusion_model", "vae", "audio_vae", "text_encoder")
FOLDERS = {"diffusion_model": "diffusion_models", "vae": "vae", "audio_vae": "vae",
           "text_encoder": "text_encoders"}
# the LTX2Pipeline components whose configs each file's <stem>.diffusers/ holds
HOLDS = {"diffusion_model": ("transformer", "scheduler"), "vae": ("vae",),
         "audio_vae": ("audio_vae", "vocoder"), "text_encoder": ("text_encoder", "tokenizer")}
# ComfyUI's quantized layers (its int8 "convrot" / fp8 scaled files: the shipped LTX-2.5 ones)
QUANTIZED = (".weight_scale", ".comfy_quant", ".scale_weight", ".input_scale")
_cache: dict[tuple[tuple[str, int], ...], dict[str, Any]] = {}
_lock = threading.Lock()


def load_files(paths: dict[str, Path]) -> dict[str, Any]:
    """The LTX2Pipeline components (float32, eval) of the four files `paths` (by `ROLES`).
    Cached by the files' paths and mtimes. Raises ModelLoadError naming the file or folder."""
    key = tuple((str(paths[r].resolve()), paths[r].stat().st_mtime_ns) for r in ROLES)
    with _lock:
        if key in _cache:
            return _cache[key]
    from workers.models.ltx2.loading import _settle

    components = _load(paths)
    _settle(components)
    with _lock:
        _cache[key] = components
    return components


def _load(paths: dict[str, Path]) -> dict[str, Any]:
    from diffusers import FlowMatchEulerDiscreteScheduler
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from workers.models.ltx2.loading import build_parts, gemma_from_state
    from workers.models.weights import load_errors, sidecar

    configs = {role: _configs(role, paths[role]) for role in ROLES}
    merged: dict[str, Any] = {}
    gemma: dict[str, Any] = {}
    for role in ROLES:
        with load_errors(paths[role], f"LTX-2's {role.replace('_', ' ')}", FOLDERS[role]):
            state = load_file(str(paths[role]))
        if any(key.endswith(QUANTIZED) for key in state):
            raise ModelLoadError(
                f"{paths[role].name} holds quantized weights (ComfyUI's int8 / fp8 layers with "
                "their scales): LTX-2 loads unquantized files here (bf16, fp16 or fp32; plain "
                "fp8 weights without scales too)")
        ours, rest = _original(role, state)
        if role != "text_encoder" and rest:
            raise ModelLoadError(f"{paths[role].name} is not LTX-2's {role.replace('_', ' ')} "
                                 f"file (it has {sorted(rest)[:3]})")
        merged.update(ours)
        gemma = rest if role == "text_encoder" else gemma
    connectors = next((configs[r] for r in ("text_encoder", "diffusion_model")
                       if (configs[r] / "connectors").is_dir()), None)
    if connectors is None:
        raise ModelLoadError(
            f"LTX-2's text connectors need their config: put connectors/config.json in "
            f"{sidecar(paths['text_encoder'], '.diffusers')}/")
    where = {"transformer": configs["diffusion_model"], "connectors": connectors,
             "vae": configs["vae"], "audio_vae": configs["audio_vae"],
             "vocoder": configs["audio_vae"]}
    layout = "LTX-2.3 or later" if keys.is_ltx23(merged) else "LTX-2.0"
    names = " + ".join(paths[r].name for r in ROLES)
    out = build_parts(keys.from_original(merged), where, f"{names} ({layout})",
                      paths["diffusion_model"])
    te = configs["text_encoder"]
    try:
        out["text_encoder"] = gemma_from_state(te / "text_encoder", gemma)
        out["tokenizer"] = AutoTokenizer.from_pretrained(te / "tokenizer", local_files_only=True)
        out["scheduler"] = FlowMatchEulerDiscreteScheduler.from_pretrained(
            configs["diffusion_model"] / "scheduler", local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"cannot load {names}' text encoder, tokenizer or scheduler from "
                             f"their configs folders: {exc}") from None
    return out


def _configs(role: str, path: Path) -> Path:
    """The file's `<stem>.diffusers/`, with a folder for each component it holds."""
    from workers.models.weights import sidecar

    folder = sidecar(path, ".diffusers")
    missing = [c for c in HOLDS[role] if not (folder / c).is_dir()]
    if missing:
        raise ModelLoadError(
            f"{path.name}: LTX-2's {role.replace('_', ' ')} file needs its diffusers configs "
            f"beside it: put {', '.join(c + '/' for c in missing)} (an LTX2Pipeline folder's) "
            f"in {folder}/")
    if role == "text_encoder" and not any((folder / "tokenizer").glob("tokenizer*")):
        raise ModelLoadError(f"{path.name}: no tokenizer files (tokenizer.json, "
                             f"tokenizer_config.json, …) in {folder / 'tokenizer'}/")
    return folder


def _original(role: str, state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the file's tensors under the all-in-one file's keys, the ones that are not LTX-2's
    components: a text encoder file's Gemma)."""
    ours: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    for key, value in state.items():
        bare = key.removeprefix(keys.DIT)
        if key.startswith(keys.PROJECTION):
            ours[key] = value
        elif role == "diffusion_model" or bare.startswith(keys.CONNECTORS):
            ours[keys.DIT + bare] = value
        elif role == "vae":
            ours["vae." + key.removeprefix("vae.")] = value
        elif role == "audio_vae" and key.startswith(("audio_vae.", "vocoder.")):
            ours[key] = value
        else:
            rest[key] = value
    return ours, rest


def to_files(components: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The components' weights as the four files keep them (by `ROLES`; the inverse of
    `_original`, for the tiny stack): the connector blocks in the diffusion model's file, their
    projection with the Gemma's text model (ComfyUI's `model.` keys) in the text encoder's."""
    state = keys.to_original({c: components[c].state_dict() for c in
                              ("transformer", "connectors", "vae", "audio_vae", "vocoder")})
    language = components["text_encoder"].model.language_model.state_dict()
    files: dict[str, dict[str, Any]] = {
        "diffusion_model": {k: v for k, v in state.items() if k.startswith(keys.DIT)},
        "vae": {k.removeprefix("vae."): v for k, v in state.items() if k.startswith("vae.")},
        "audio_vae": {k: v for k, v in state.items() if k.startswith(("audio_vae.", "vocoder."))},
        "text_encoder": {**{k: v for k, v in state.items() if k.startswith(keys.PROJECTION)},
                         **{"model." + k: v.contiguous() for k, v in language.items()}},
    }
    return files
