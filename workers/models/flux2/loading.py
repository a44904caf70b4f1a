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

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workers.device.policy import DevicePolicy, Placement
from workers.models.cache import MODEL_CACHE
from workers.models.catalog import file_sha256, resolve
from workers.models.family import ModelLoadError
from workers.models.flux2 import LATENT, engine, keys, text_encoder_kind
from workers.models.header import read_header
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

FAMILY = "flux2"


def load_diffusion_model(models_dir: Path, name: str, policy: DevicePolicy) -> DiffusionModel:
    """The FLUX.2 transformer `diffusion_models/<name>` with its step batcher (cached)."""
    path = resolve(models_dir, "diffusion_models", name)
    sha, placement = file_sha256(path), policy.placement("denoiser")
    refuse_int8(policy)

    def load() -> DiffusionModel:
        transformer = _load_transformer(path, placement)
        return denoiser_model(name=name, sha=sha, transformer=transformer, predict=engine.predict,
                              placement=placement, policy=policy, family=FAMILY)

    return MODEL_CACHE.get_or_load(("flux2-transformer", sha, placement, policy.attention), load)


def load_vae(models_dir: Path, name: str, policy: DevicePolicy) -> Vae:
    """The AutoencoderKLFlux2 `vae/<name>` (cached)."""
    from diffusers import AutoencoderKLFlux2

    path = resolve(models_dir, "vae", name)
    sha, placement = file_sha256(path), policy.placement("vae")

    def load() -> Vae:
        module = rest(_load_module(AutoencoderKLFlux2, path, placement, "a FLUX.2 VAE", "vae"),
                      placement)
        return vae_model(name=name, sha=sha, module=module, placement=placement, policy=policy,
                         decode=engine.decode_latents_batch, latent=LATENT, family=FAMILY)

    key = ("flux2-vae", sha, placement, policy.vae_tiling, policy.vae_slicing)
    return MODEL_CACHE.get_or_load(key, load)


def load_text_encoder(models_dir: Path, names: Sequence[str], policy: DevicePolicy) -> TextEncoder:
    """Klein's Qwen3 `text_encoders/<name>` (one file) with its tokenizer (cached)."""
    refuse_int8(policy)
    if len(names) != 1:
        raise ModelLoadError(f"FLUX.2 uses one text encoder (Klein: a Qwen3), got {len(names)} "
                             "files")
    path = resolve(models_dir, "text_encoders", names[0])
    header = read_header(path)
    kind = None if header is None else text_encoder_kind(header)
    if kind != "qwen3":
        raise ModelLoadError(f"{path.name} is not a text encoder this worker runs for FLUX.2: "
                             "Klein's Qwen3 is supported; dev's Mistral is not yet")
    sha, placement = file_sha256(path), policy.placement("text-encoder")

    def load() -> TextEncoder:
        model, tokenizer = _load_qwen3(path, placement)
        return text_encoder_model(name=path.name, sha=sha, model=model, tokenizer=tokenizer,
                                  placement=placement, policy=policy,
                                  encode=engine.encode_prompts, family=FAMILY)

    return MODEL_CACHE.get_or_load(("flux2-text-encoder", sha, placement), load)


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
    import torch
    from safetensors.torch import load_file

    config = cls.load_config(str(config_path(path, what)))
    with load_errors(path, what, folder):
        state = load_file(str(path))
        if keys.is_original(list(state)):
            state = keys.from_original(state)
        elif keys.is_original_vae(list(state)):
            state = keys.vae_from_original(state, dict(config))
        with torch.device("meta"):
            model = cls.from_config(config)
        result = model.load_state_dict(state, strict=False, assign=True)
        if result.missing_keys or result.unexpected_keys:
            raise ModelLoadError(
                f"{path.name} does not match its config: missing {result.missing_keys[:3]}, "
                f"unexpected {result.unexpected_keys[:3]}")
        check_complete(model, path)
    return model.to(placement.torch_dtype)


def _load_transformer(path: Path, placement: Placement) -> Any:
    from diffusers import Flux2Transformer2DModel

    model = _load_module(Flux2Transformer2DModel, path, placement, "a FLUX.2 transformer",
                         "diffusion_models")
    if placement.device == "cpu":
        own_storage(model)
    return model.to(placement.device).eval()  # the denoiser never waits offloaded


def _load_qwen3(path: Path, placement: Placement) -> tuple[Any, Any]:
    """A Qwen3Model (the hidden states Klein reads; no LM head) and its tokenizer."""
    from transformers import AutoTokenizer, Qwen3Model

    tok_dir = path if path.is_dir() else sidecar(path, ".tokenizer")
    if not (tok_dir / "tokenizer_config.json").is_file():
        raise ModelLoadError(f"no tokenizer for text encoder {path.name}: put its tokenizer "
                             f"files (tokenizer.json, tokenizer_config.json, …) in {tok_dir}/")
    with load_errors(path, "a Qwen3 text encoder", "text_encoders"):
        tokenizer = AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
        model = (_from_file(Qwen3Model, path, placement) if path.is_file() else
                 Qwen3Model.from_pretrained(path, local_files_only=True,
                                            dtype=placement.torch_dtype))
        check_complete(model, path)
    if tokenizer.pad_token is None or not tokenizer.chat_template:
        raise ModelLoadError(f"the tokenizer in {tok_dir} needs a pad_token and a chat_template")
    return rest(model, placement), tokenizer


def _from_file(cls: Any, path: Path, placement: Placement) -> Any:
    """A transformers model from one weight file and its sidecar config, both linked into a
    temporary folder laid out as from_pretrained reads one."""
    config = sidecar(path, ".config.json")
    if not config.is_file():
        raise ModelLoadError(f"a single-file text encoder needs its transformers config: put "
                             f"it in {config} (or use the encoder's folder)")
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").symlink_to(config.resolve())
        (Path(folder) / "model.safetensors").symlink_to(path.resolve())
        return cls.from_pretrained(folder, local_files_only=True, dtype=placement.torch_dtype)
