"""Load FLUX.2 components from the models dir, offline, cached per worker process.

- transformer `diffusion_models/<name>`: a single file in the original / ComfyUI layout or
  diffusers', with its config in the sidecar `<stem>.config.json`, or a diffusers folder. A file
  without `guidance_in` weights is Klein (no guidance embedding).
- VAE `vae/<name>`: an AutoencoderKLFlux2, a single file in the original / ComfyUI `ae` layout
  (`encoder.down.*`) or diffusers', with its sidecar config, or a diffusers folder.
- text encoder `text_encoders/<name>`: Klein's Qwen3, a transformers folder with its tokenizer,
  or a single file with `<stem>.config.json` and `<stem>.tokenizer/` beside it.
Nothing here downloads: a missing config or tokenizer is an error naming where to put it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workers.device.policy import DevicePolicy, Placement
from workers.models.catalog import resolve
from workers.models.family import ModelLoadError
from workers.models.flux2 import LATENT, engine, keys, text_encoder_kind
from workers.models.header import read_header
from workers.models.values import DiffusionModel, TextEncoder, Vae
from workers.models.weights import (
    assign_state,
    cached_denoiser,
    cached_text_encoder,
    cached_vae,
    check_complete,
    load_errors,
    load_transformers_encoder,
    load_weights,
    placed_denoiser,
    rest,
    sidecar,
)

FAMILY = "flux2"


def load_diffusion_model(models_dir: Path, name: str, policy: DevicePolicy) -> DiffusionModel:
    """The FLUX.2 transformer `diffusion_models/<name>` with its step batcher (cached)."""
    return cached_denoiser(models_dir, name, policy, family=FAMILY, key="flux2-transformer",
                           load=_load_transformer, predict=engine.predict)


def load_vae(models_dir: Path, name: str, policy: DevicePolicy) -> Vae:
    """The AutoencoderKLFlux2 `vae/<name>` (cached)."""
    return cached_vae(models_dir, name, policy, family=FAMILY, key="flux2-vae", load=_load_vae,
                      decode=engine.decode_latents_batch, latent=LATENT)


def load_text_encoder(models_dir: Path, names: Sequence[str], policy: DevicePolicy) -> TextEncoder:
    """Klein's Qwen3 or dev's Mistral3 `text_encoders/<name>` (one file) with its tokenizer
    (cached)."""
    if len(names) != 1:
        raise ModelLoadError(f"FLUX.2 uses one text encoder (Klein: a Qwen3, dev: a Mistral3), "
                             f"got {len(names)} files")
    path = resolve(models_dir, "text_encoders", names[0])
    header = read_header(path)
    kind = None if header is None else text_encoder_kind(header)
    if kind is None:
        raise ModelLoadError(f"{path.name} is not a FLUX.2 text encoder (Klein's Qwen3 or "
                             "dev's Mistral3)")
    load = _load_qwen3 if kind == "qwen3" else _load_mistral3
    return cached_text_encoder([path], policy, family=FAMILY, key="flux2-text-encoder",
                               load=lambda placement: load(path, placement),
                               encode=engine.encode_prompts)


def config_path(path: Path, what: str) -> Path:
    """The sidecar config.json of a single-file `path`; a ModelLoadError naming where it goes
    (FLUX.2's sizes vary by variant: no shipped default)."""
    own = sidecar(path, ".config.json")
    if not own.is_file():
        raise ModelLoadError(f"{path.name} is {what} in a single file: put its diffusers "
                             f"config.json beside it as {own}")
    return own


def _load_module(cls: Any, path: Path, placement: Placement, what: str, folder: str) -> Any:
    """`cls` from a diffusers folder, or from one file with diffusers keys and its sidecar
    config (built on the meta device, then the file's tensors assigned)."""
    if path.is_dir():
        return load_weights(cls, path, placement, path, what, folder)
    from safetensors.torch import load_file

    config = cls.load_config(str(config_path(path, what)))
    with load_errors(path, what, folder):
        state = load_file(str(path))
        if keys.is_original(list(state)):
            state = keys.from_original(state)
        elif keys.is_original_vae(list(state)):
            state = keys.vae_from_original(state, dict(config))
        model = assign_state(cls, config, state, path)
        check_complete(model, path)
    return model.to(placement.torch_dtype)


def _load_vae(path: Path, placement: Placement) -> Any:
    from diffusers import AutoencoderKLFlux2

    return rest(_load_module(AutoencoderKLFlux2, path, placement, "a FLUX.2 VAE", "vae"),
                placement)


def _load_transformer(path: Path, placement: Placement) -> Any:
    from diffusers import Flux2Transformer2DModel

    return placed_denoiser(_load_module(Flux2Transformer2DModel, path, placement,
                                        "a FLUX.2 transformer", "diffusion_models"), placement)


def _load_qwen3(path: Path, placement: Placement) -> tuple[Any, Any]:
    """A Qwen3Model (the hidden states Klein reads; no LM head) and its tokenizer."""
    from transformers import Qwen3Model

    return load_transformers_encoder(Qwen3Model, path, placement, "a Qwen3 text encoder",
                                     chat=True)


def _load_mistral3(path: Path, placement: Placement) -> tuple[Any, Any]:
    """Dev's Mistral3ForConditionalGeneration (the hidden states Flux2Pipeline reads) and its
    tokenizer, whose chat template renders the pipeline's system + user messages."""
    from transformers import Mistral3ForConditionalGeneration

    return load_transformers_encoder(Mistral3ForConditionalGeneration, path, placement,
                                     "a Mistral3 text encoder", chat=True)
