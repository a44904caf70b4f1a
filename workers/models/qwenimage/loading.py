"""Load Qwen-Image components from the models dir, offline, cached per worker process.

- transformer `diffusion_models/<name>`: a single file (diffusers' names, which ComfyUI keeps,
  with or without `model.diffusion_model.`) or a diffusers folder; its config is the sidecar
  `<stem>.config.json`, else the shipped Qwen-Image one (`configs/transformer/`). A config
  with `zero_cond_t` (Qwen-Image-Edit-2511's), or ComfyUI's `__index_timestep_zero__` marker
  in the file (its 2511 files), reads reference latents at timestep 0 unless a prompt says
  otherwise (`qwenimage/reference-latent`'s `method`).
- VAE `vae/<name>`: AutoencoderKLQwenImage in the original (Wan) keys ComfyUI ships or
  diffusers', or a folder; config as above.
- text encoder `text_encoders/<name>`: Qwen2.5-VL, a transformers folder with its tokenizer, or
  a single file (the checkpoint's `model.layers` / `visual.` keys) with `<stem>.config.json`
  and `<stem>.tokenizer/` beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workers.device.policy import DevicePolicy, Placement
from workers.models.catalog import resolve
from workers.models.family import ModelLoadError
from workers.models.qwenimage import DIFFUSION_PREFIX, LATENT, engine, keys
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

FAMILY = "qwenimage"
CONFIGS = Path(__file__).parent / "configs"
ENCODER_CLASS = "Qwen2_5_VLForConditionalGeneration"
TIMESTEP_ZERO_MARKER = "__index_timestep_zero__"  # an empty tensor in ComfyUI's 2511 files


def load_diffusion_model(models_dir: Path, name: str, policy: DevicePolicy) -> DiffusionModel:
    """The Qwen-Image transformer `diffusion_models/<name>` with its step batcher (cached)."""
    return cached_denoiser(models_dir, name, policy, family=FAMILY, key="qwenimage-transformer",
                           load=_load_transformer, predict=engine.predict)


def load_vae(models_dir: Path, name: str, policy: DevicePolicy) -> Vae:
    """The Qwen-Image AutoencoderKLQwenImage `vae/<name>` (cached)."""
    return cached_vae(models_dir, name, policy, family=FAMILY, key="qwenimage-vae",
                      load=lambda path, placement: rest(_load_vae(path, placement), placement),
                      decode=engine.decode_latents_batch, latent=LATENT)


def load_text_encoder(models_dir: Path, names: Sequence[str], policy: DevicePolicy) -> TextEncoder:
    """Qwen2.5-VL from one `text_encoders/` entry, with its tokenizer (cached)."""
    if len(names) != 1:
        raise ModelLoadError(f"Qwen-Image uses one text encoder (a Qwen2.5-VL), got "
                             f"{len(names)} files: {', '.join(names)}")
    path = resolve(models_dir, "text_encoders", names[0])
    return cached_text_encoder([path], policy, family=FAMILY, key="qwenimage-text-encoder",
                               load=lambda placement: _load_encoder(path, placement),
                               encode=engine.encode_prompts)


def _config(path: Path, role: str) -> Path:
    return config_or_shipped(path, CONFIGS, role)


def _load_transformer(path: Path, placement: Placement) -> Any:
    from diffusers import QwenImageTransformer2DModel

    what, folder = "a Qwen-Image transformer", "diffusion_models"
    if path.is_dir():
        model = load_weights(QwenImageTransformer2DModel, path, placement, path, what, folder)
    else:
        with load_errors(path, what, folder):
            model = _from_file(QwenImageTransformer2DModel, path, _config(path, "transformer"),
                               placement, DIFFUSION_PREFIX)
            check_complete(model, path)
    return placed_denoiser(model, placement)


def _load_vae(path: Path, placement: Placement) -> Any:
    from diffusers import AutoencoderKLQwenImage

    what, folder = "a Qwen-Image VAE", "vae"
    if path.is_dir():
        return load_weights(AutoencoderKLQwenImage, path, placement, path, what, folder)
    with load_errors(path, what, folder):
        model = _from_file(AutoencoderKLQwenImage, path, _config(path, "vae"), placement, "")
        check_complete(model, path)
    return model


def _from_file(cls: Any, path: Path, config_path: Path, placement: Placement, prefix: str) -> Any:
    """`cls` built from its config with its parameters on the meta device, its weights assigned
    from the file (a `prefix` such as ComfyUI's `model.diffusion_model.` dropped; a VAE in the
    original Wan layout converted); every key must match."""
    from accelerate import init_empty_weights
    from safetensors.torch import load_file

    state = {k.removeprefix(prefix) if prefix else k: v for k, v in load_file(str(path)).items()}
    if keys.is_original(state):  # a VAE in the original (Wan) layout
        state = keys.from_original(state)
    config = cls.load_config(str(config_path))
    if state.pop(TIMESTEP_ZERO_MARKER, None) is not None:  # ComfyUI's word for zero_cond_t
        config = {**config, "zero_cond_t": True}
    # computed tables such as the rotary frequencies stay real (buffers off the meta device)
    with init_empty_weights(include_buffers=False):
        model = cls.from_config(config)
    result = model.load_state_dict(state, strict=False, assign=True)
    if result.missing_keys or result.unexpected_keys:
        raise ModelLoadError(
            f"{path.name} does not match its config {config_path.name}: missing "
            f"{result.missing_keys[:3]}, unexpected {result.unexpected_keys[:3]}")
    return model.to(placement.torch_dtype)


def _load_encoder(path: Path, placement: Placement) -> tuple[Any, Any]:
    """The Qwen2.5-VL and its Tokenizers (the Qwen2-VL processor too when its folder has one)."""
    import transformers

    model, tokenizer = load_transformers_encoder(getattr(transformers, ENCODER_CLASS), path,
                                                 placement, "a Qwen2.5-VL text encoder")
    folder = tokenizer_folder(path)
    return model, engine.Tokenizers(tokenizer, load_processor(folder), folder)


PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")


def load_processor(folder: Path) -> Any:
    """The Qwen2-VL processor (image processor + tokenizer) saved in `folder`, local files only;
    None when the folder has no processor config (a text-to-image stack needs none)."""
    if not any((folder / name).is_file() for name in PROCESSOR_FILES):
        return None
    from workers.models.qwenimage.vl import ImageTextProcessor

    with load_errors(folder, "the Qwen2-VL processor", "text_encoders"):
        return ImageTextProcessor.from_pretrained(folder, local_files_only=True)
