"""Load Z-Image components from the models dir, offline, cached per worker process.

Where the config comes from (nothing is ever downloaded; every load is local_files_only):
- a single weight file `<folder>/<stem>.safetensors` takes its diffusers/transformers config from
  the sidecar `<folder>/<stem>.config.json` when present, else from the config the farm ships
  for the full-size Z-Image Turbo family (`configs/<role>/`);
- a single-file text encoder also needs its tokenizer files in the sidecar folder
  `<folder>/<stem>.tokenizer/` (a single file holds no tokenizer);
- a folder model (diffusers / transformers layout, with config.json) carries its own config.
Transformer files may use the diffusers key layout or the original / ComfyUI one
(`model.diffusion_model.` prefix, fused qkv); VAE files the diffusers or the original Flux
`ae.safetensors` layout; text-encoder files Qwen3Model or Qwen3ForCausalLM keys.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import torch

from workers.device.policy import DevicePolicy, Placement
from workers.models.catalog import resolve
from workers.models.family import ModelLoadError
from workers.models.values import DiffusionModel, TextEncoder, Vae
from workers.models.weights import (
    cached_denoiser,
    cached_text_encoder,
    cached_vae,
    check_complete,
    config_or_shipped,
    load_errors,
    load_weights,
    placed_denoiser,
    rest,
    tokenizer_folder,
)
from workers.models.zimage import LATENT, engine
from workers.models.zimage.engine import CONFIGS, predict_velocity


@cache
def _model_libraries() -> None:
    """Import diffusers' and transformers' Z-Image classes, then freeze every object alive out of
    the collector's full passes (inline_farm/heap.py): ~300 k objects that a full pass would walk
    in ~150 ms, stopping every slot. Once per process, under the model cache's lock, before the
    first model is built: a model is never frozen (one in a reference cycle would never be freed
    after its eviction; tests/workers/test_heap.py)."""
    import diffusers  # noqa: F401
    import transformers  # noqa: F401
    from diffusers import AutoencoderKL, ZImageTransformer2DModel  # noqa: F401
    from diffusers.pipelines.z_image.pipeline_z_image import ZImagePipeline  # noqa: F401
    from transformers import Qwen3Model  # noqa: F401

    from inline_farm.heap import freeze_long_lived

    freeze_long_lived("model libraries")


__all__ = ["ModelLoadError", "load_diffusion_model", "load_text_encoder", "load_vae"]
FAMILY = "zimage"


def load_diffusion_model(models_dir: Path, name: str, policy: DevicePolicy) -> DiffusionModel:
    """The Z-Image transformer `diffusion_models/<name>` with its step batcher (cached)."""
    return cached_denoiser(models_dir, name, policy, family=FAMILY, key="transformer",
                           load=_after_libraries(_load_transformer), predict=predict_velocity)


def load_vae(models_dir: Path, name: str, policy: DevicePolicy) -> Vae:
    """The AutoencoderKL `vae/<name>` (cached), tiled / sliced when the policy says so."""
    return cached_vae(models_dir, name, policy, family=FAMILY, key="vae",
                      load=_after_libraries(_load_vae), decode=engine.decode_latents_batch,
                      latent=LATENT)


def load_text_encoder(models_dir: Path, name: str, policy: DevicePolicy) -> TextEncoder:
    """The Qwen3 text encoder `text_encoders/<name>` and its tokenizer (cached)."""
    path = resolve(models_dir, "text_encoders", name)
    load = _after_libraries(_load_text_encoder)
    return cached_text_encoder([path], policy, family=FAMILY, key="text-encoder",
                               load=lambda placement: load(path, placement),
                               encode=engine.encode_prompts, name=name)


def _after_libraries(load: Any) -> Any:
    """`load(path, placement)` once the model libraries are imported and frozen."""
    def loaded(path: Path, placement: Placement) -> Any:
        _model_libraries()
        return load(path, placement)

    return loaded


def config_for(path: Path, role: str) -> Path:
    """The config.json to build `path` with: its sidecar, else the shipped full-size one."""
    return config_or_shipped(path, CONFIGS, role)


def _load_transformer(path: Path, placement: Placement) -> Any:
    from diffusers import ZImageTransformer2DModel

    return placed_denoiser(_load_weights(ZImageTransformer2DModel, path, placement, "transformer",
                                         "a Z-Image transformer", "diffusion_models"), placement)


def _load_vae(path: Path, placement: Placement) -> Any:
    from diffusers import AutoencoderKL

    model = _load_weights(AutoencoderKL, path, placement, "vae", "a Flux-geometry VAE", "vae")
    return rest(model, placement)


def _load_weights(cls: Any, path: Path, placement: Placement, role: str, what: str,
                  folder: str) -> Any:
    """`cls` from a diffusers folder, or from a single file with its config; checked complete."""
    return load_weights(cls, path, placement, config_for(path, role), what, folder)


def _load_text_encoder(path: Path, placement: Placement) -> tuple[Any, Any]:
    from transformers import AutoTokenizer, Qwen3Model

    dtype = placement.torch_dtype
    tok_dir = tokenizer_folder(path)
    with load_errors(path, "a Qwen3 text encoder", "text_encoders"):
        tokenizer = AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
        if path.is_dir():
            model = Qwen3Model.from_pretrained(path, local_files_only=True, dtype=dtype)
        else:
            model = _qwen3_from_file(path, dtype)
        check_complete(model, path)
    if tokenizer.pad_token is None or not tokenizer.chat_template:
        raise ModelLoadError(f"the tokenizer in {tok_dir} needs a pad_token and a chat_template")
    return rest(model, placement), tokenizer


def _qwen3_from_file(path: Path, dtype: torch.dtype) -> Any:
    """A Qwen3Model from one weight file (Qwen3Model or Qwen3ForCausalLM keys)."""
    from safetensors.torch import load_file
    from transformers import Qwen3Config, Qwen3Model

    config = Qwen3Config.from_json_file(str(config_for(path, "text_encoder")))
    config._attn_implementation = "sdpa"  # what from_pretrained picks for a folder
    state = load_file(str(path)) if path.suffix in (".safetensors", ".sft") else torch_load(path)
    state = {k.removeprefix("model."): v for k, v in state.items() if not k.startswith("lm_head.")}
    with torch.device("meta"):
        model: Any = Qwen3Model(config)
    result = model.load_state_dict(state, strict=False, assign=True)
    if result.missing_keys:
        raise ModelLoadError(f"{path.name} lacks weights such as {result.missing_keys[:3]}")
    # The rotary tables are computed, not stored: rebuild them off the meta device.
    model.rotary_emb = type(model.rotary_emb)(config=config)
    return model.to(dtype)


def torch_load(path: Path) -> dict[str, Any]:
    state = torch.load(path, map_location="cpu", weights_only=True)
    return state.get("state_dict", state)


