"""Load Qwen-Image 2.1 components from the models dir, offline, cached per worker process.

- transformer `diffusion_models/<name>`: a single file (diffusers' names, with or without
  ComfyUI's `model.diffusion_model.`) or a diffusers folder; its config is the sidecar
  `<stem>.config.json`, else the shipped full-size one (`configs/transformer/`).
- VAE `vae/<name>`: AutoencoderKLQwenImage21 in diffusers' keys, or a folder; config as above.
- text encoder `text_encoders/<name>`: Qwen3-VL, a transformers folder with its tokenizer, or a
  single file (the checkpoint's `model.language_model` / `model.visual` keys) with
  `<stem>.config.json` and `<stem>.tokenizer/` beside it; the Qwen3-VL image processor's files
  in that folder make condition images possible.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workers.device.policy import DevicePolicy, Placement
from workers.models.catalog import resolve
from workers.models.family import ModelLoadError
from workers.models.qwenimage.loading import PROCESSOR_FILES, _from_file
from workers.models.qwenimage21 import DIFFUSION_PREFIX, LATENT, engine
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
    tokenizer_folder,
)

FAMILY = "qwenimage21"
CONFIGS = Path(__file__).parent / "configs"


def load_diffusion_model(models_dir: Path, name: str, policy: DevicePolicy) -> DiffusionModel:
    """The Qwen-Image 2.1 transformer `diffusion_models/<name>` with its step batcher (cached)."""
    return cached_denoiser(models_dir, name, policy, family=FAMILY, key="qwenimage21-transformer",
                           load=_load_transformer, predict=engine.predict)


def load_vae(models_dir: Path, name: str, policy: DevicePolicy) -> Vae:
    """The AutoencoderKLQwenImage21 `vae/<name>` (cached)."""
    return cached_vae(models_dir, name, policy, family=FAMILY, key="qwenimage21-vae",
                      load=lambda path, placement: rest(_load_vae(path, placement), placement),
                      decode=engine.decode_latents_batch, latent=LATENT)


def load_text_encoder(models_dir: Path, names: Sequence[str], policy: DevicePolicy) -> TextEncoder:
    """Qwen3-VL from one `text_encoders/` entry, with its tokenizer (cached)."""
    if len(names) != 1:
        raise ModelLoadError(f"Qwen-Image 2.1 uses one text encoder (a Qwen3-VL), got "
                             f"{len(names)} files: {', '.join(names)}")
    path = resolve(models_dir, "text_encoders", names[0])
    return cached_text_encoder([path], policy, family=FAMILY, key="qwenimage21-text-encoder",
                               load=lambda placement: _load_encoder(path, placement),
                               encode=engine.encode_prompts)


def _load_transformer(path: Path, placement: Placement) -> Any:
    from diffusers import QwenImage21Transformer2DModel

    what, folder = "a Qwen-Image 2.1 transformer", "diffusion_models"
    if path.is_dir():
        model = load_weights(QwenImage21Transformer2DModel, path, placement, path, what, folder)
    else:
        with load_errors(path, what, folder):
            model = _from_file(QwenImage21Transformer2DModel, path,
                               config_or_shipped(path, CONFIGS, "transformer"), placement,
                               DIFFUSION_PREFIX)
            check_complete(model, path)
    return placed_denoiser(model, placement)


def _load_vae(path: Path, placement: Placement) -> Any:
    from diffusers import AutoencoderKLQwenImage21

    what, folder = "a Qwen-Image 2.1 VAE", "vae"
    if path.is_dir():
        return load_weights(AutoencoderKLQwenImage21, path, placement, path, what, folder)
    with load_errors(path, what, folder):
        model = _from_file(AutoencoderKLQwenImage21, path,
                           config_or_shipped(path, CONFIGS, "vae"), placement, "")
        check_complete(model, path)
    return model


def _load_encoder(path: Path, placement: Placement) -> tuple[Any, Any]:
    """The Qwen3-VL and its Tokenizers (the processor too when its folder has one)."""
    from transformers import Qwen3VLForConditionalGeneration

    model, tokenizer = load_transformers_encoder(Qwen3VLForConditionalGeneration, path,
                                                 placement, "a Qwen3-VL text encoder")
    folder = tokenizer_folder(path)
    return model, engine.Tokenizers(tokenizer, _processor(folder), folder)


def _processor(folder: Path) -> Any:
    if not any((folder / name).is_file() for name in PROCESSOR_FILES):
        return None
    with load_errors(folder, "the Qwen3-VL processor", "text_encoders"):
        return engine.ImageTextProcessor.from_pretrained(folder, local_files_only=True)
