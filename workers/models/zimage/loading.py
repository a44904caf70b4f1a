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
from workers.models.cache import MODEL_CACHE
from workers.models.catalog import file_sha256, resolve
from workers.models.family import ModelLoadError
from workers.models.values import DiffusionModel, TextEncoder, Vae
from workers.models.weights import (
    check_complete,
    denoiser_model,
    load_errors,
    load_weights,
    own_storage,
    refuse_int8,
    rest,
    sidecar,
    text_encoder_model,
    vae_model,
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
    path = resolve(models_dir, "diffusion_models", name)
    sha, placement = file_sha256(path), policy.placement("denoiser")
    refuse_int8(policy)

    def load() -> DiffusionModel:
        _model_libraries()
        transformer = _load_transformer(path, placement)
        return denoiser_model(name=name, sha=sha, transformer=transformer, predict=predict_velocity,
                              placement=placement, policy=policy, family=FAMILY)

    return MODEL_CACHE.get_or_load(("transformer", sha, placement, policy.attention), load)


def load_vae(models_dir: Path, name: str, policy: DevicePolicy) -> Vae:
    """The AutoencoderKL `vae/<name>` (cached), tiled / sliced when the policy says so."""
    path = resolve(models_dir, "vae", name)
    sha, placement = file_sha256(path), policy.placement("vae")

    def load() -> Vae:
        _model_libraries()
        return vae_model(name=name, sha=sha, module=_load_vae(path, placement),
                         placement=placement, policy=policy,
                         decode=engine.decode_latents_batch, latent=LATENT, family=FAMILY)

    key = ("vae", sha, placement, policy.vae_tiling, policy.vae_slicing)
    return MODEL_CACHE.get_or_load(key, load)


def load_text_encoder(models_dir: Path, name: str, policy: DevicePolicy) -> TextEncoder:
    """The Qwen3 text encoder `text_encoders/<name>` and its tokenizer (cached)."""
    path = resolve(models_dir, "text_encoders", name)
    sha, placement = file_sha256(path), policy.placement("text-encoder")
    refuse_int8(policy)

    def load() -> TextEncoder:
        _model_libraries()
        model, tokenizer = _load_text_encoder(path, placement)
        return text_encoder_model(name=name, sha=sha, model=model, tokenizer=tokenizer,
                                  placement=placement, policy=policy,
                                  encode=engine.encode_prompts, family=FAMILY)

    return MODEL_CACHE.get_or_load(("text-encoder", sha, placement), load)


def config_for(path: Path, role: str) -> Path:
    """The config.json to build `path` with: its sidecar, else the shipped full-size one."""
    own = sidecar(path, ".config.json")
    return own if own.is_file() else CONFIGS / role / "config.json"


def _load_transformer(path: Path, placement: Placement) -> Any:
    from diffusers import ZImageTransformer2DModel

    model = _load_weights(ZImageTransformer2DModel, path, placement, "transformer",
                          "a Z-Image transformer", "diffusion_models")
    if placement.device == "cpu":
        own_storage(model)
    return model.to(placement.device).eval()  # the denoiser never waits offloaded


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
    tok_dir = path if path.is_dir() else sidecar(path, ".tokenizer")
    if not (tok_dir / "tokenizer_config.json").is_file():
        raise ModelLoadError(
            f"no tokenizer for text encoder {path.name}: put its tokenizer files "
            f"(tokenizer.json, tokenizer_config.json, …) in {tok_dir}/"
        )
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


