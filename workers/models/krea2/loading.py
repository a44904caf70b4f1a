"""Load Krea 2 components from the models dir, offline, cached per worker process.

- transformer `diffusion_models/<name>`: a single file in the original keys ComfyUI ships (with
  or without `model.diffusion_model.`; diffusers' converter reads it) or diffusers' names, or a
  diffusers folder; its config is the sidecar `<stem>.config.json`, else the shipped Krea 2 one
  (`configs/transformer/`).
- VAE `vae/<name>`: Qwen-Image's AutoencoderKLQwenImage in the original (Wan) keys ComfyUI ships
  (diffusers' `convert_wan_vae_to_diffusers`) or diffusers', or a folder; config as above.
- text encoder `text_encoders/<name>`: Qwen3-VL (`Qwen3VLModel`), a transformers folder with its
  tokenizer, or a single file (the checkpoint's `model.language_model.` / `model.visual.` keys)
  with `<stem>.config.json` and `<stem>.tokenizer/` beside it; no tokenizer is an error naming
  the folder to put it in.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workers.device.policy import DevicePolicy, Placement
from workers.models.catalog import resolve
from workers.models.family import ModelLoadError
from workers.models.krea2 import DIFFUSION_PREFIX, LATENT, engine, keys
from workers.models.values import DiffusionModel, TextEncoder, Vae
from workers.models.weights import (
    cached_denoiser,
    cached_text_encoder,
    cached_vae,
    check_complete,
    config_or_shipped,
    load_errors,
    load_transformers_encoder,
    load_weights,
    placed_denoiser,
    rest,
)

FAMILY = "krea2"
CONFIGS = Path(__file__).parent / "configs"


def load_diffusion_model(models_dir: Path, name: str, policy: DevicePolicy) -> DiffusionModel:
    """The Krea 2 transformer `diffusion_models/<name>` with its step batcher (cached)."""
    return cached_denoiser(models_dir, name, policy, family=FAMILY, key="krea2-transformer",
                           load=_load_transformer, predict=engine.predict)


def load_vae(models_dir: Path, name: str, policy: DevicePolicy) -> Vae:
    """Qwen-Image's AutoencoderKLQwenImage `vae/<name>` as Krea 2 decodes it (cached)."""
    return cached_vae(models_dir, name, policy, family=FAMILY, key="krea2-vae",
                      load=lambda path, placement: rest(_load_vae(path, placement), placement),
                      decode=engine.decode_latents_batch, latent=LATENT)


def load_text_encoder(models_dir: Path, names: Sequence[str], policy: DevicePolicy) -> TextEncoder:
    """Qwen3-VL from one `text_encoders/` entry, with its tokenizer (cached)."""
    if len(names) != 1:
        raise ModelLoadError(f"Krea 2 uses one text encoder (a Qwen3-VL), got "
                             f"{len(names)} files: {', '.join(names)}")
    path = resolve(models_dir, "text_encoders", names[0])
    return cached_text_encoder([path], policy, family=FAMILY, key="krea2-text-encoder",
                               load=lambda placement: _load_encoder(path, placement),
                               encode=engine.encode_prompts)


def _load_transformer(path: Path, placement: Placement) -> Any:
    from diffusers.models import Krea2Transformer2DModel

    what, folder = "a Krea 2 transformer", "diffusion_models"
    if path.is_dir():
        model = load_weights(Krea2Transformer2DModel, path, placement, path, what, folder)
    else:
        with load_errors(path, what, folder):
            state = _state(path, DIFFUSION_PREFIX)
            if keys.is_original(state):
                state = keys.from_original(state)
            model = _built(Krea2Transformer2DModel, state, path, "transformer", placement)
    return placed_denoiser(model, placement)


def _load_vae(path: Path, placement: Placement) -> Any:
    from diffusers import AutoencoderKLQwenImage

    what, folder = "a Qwen-Image VAE (Krea 2's)", "vae"
    if path.is_dir():
        return load_weights(AutoencoderKLQwenImage, path, placement, path, what, folder)
    with load_errors(path, what, folder):
        state = _state(path, "")
        if any(k.startswith(("decoder.conv1.", "decoder.upsamples.")) for k in state):
            from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers

            state = dict(convert_wan_vae_to_diffusers(state))
        return _built(AutoencoderKLQwenImage, state, path, "vae", placement)


def _state(path: Path, prefix: str) -> dict[str, Any]:
    from safetensors.torch import load_file

    return {k.removeprefix(prefix) if prefix else k: v for k, v in load_file(str(path)).items()}


def _built(cls: Any, state: dict[str, Any], path: Path, role: str, placement: Placement) -> Any:
    """`cls` built from its config with its parameters on the meta device, its weights assigned
    from `state`; every key must match."""
    from accelerate import init_empty_weights

    config_path = config_or_shipped(path, CONFIGS, role)
    # computed tables stay real (buffers off the meta device)
    with init_empty_weights(include_buffers=False):
        model = cls.from_config(cls.load_config(str(config_path)))
    result = model.load_state_dict(state, strict=False, assign=True)
    if result.missing_keys or result.unexpected_keys:
        raise ModelLoadError(
            f"{path.name} does not match its config {config_path.name}: missing "
            f"{result.missing_keys[:3]}, unexpected {result.unexpected_keys[:3]}")
    check_complete(model, path)
    return model.to(placement.torch_dtype)


def _load_encoder(path: Path, placement: Placement) -> tuple[Any, Any]:
    """The Qwen3-VL (its base model: the pipeline's `Qwen3VLModel`) and its tokenizer."""
    from transformers import Qwen3VLModel

    return load_transformers_encoder(Qwen3VLModel, path, placement, "a Qwen3-VL text encoder")
