"""Load FLUX.1 components from the models dir, offline, cached per worker process.

- transformer `diffusion_models/<name>`: a single file in the original / ComfyUI layout or
  diffusers', or a diffusers folder; its config is the sidecar `<stem>.config.json`, else the
  shipped FLUX.1-dev one (`configs/transformer/`; a file without `guidance_in` weights is
  schnell: no guidance embedding).
- VAE `vae/<name>`: the 16-channel FLUX `ae` (original or diffusers keys), or a folder.
- text encoders: CLIP-L and T5, two `text_encoders/` entries in either order, each a
  transformers folder with its tokenizer, or a single file with `<stem>.config.json` and
  `<stem>.tokenizer/` beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workers.device.policy import DevicePolicy, Placement
from workers.models.catalog import resolve
from workers.models.family import ModelLoadError
from workers.models.flux1 import LATENT, clip_kind, engine, keys, t5_kind
from workers.models.header import read_header
from workers.models.values import DiffusionModel, TextEncoder, Vae
from workers.models.weights import (
    assign_state,
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

FAMILY = "flux1"
CONFIGS = Path(__file__).parent / "configs"


def load_diffusion_model(models_dir: Path, name: str, policy: DevicePolicy) -> DiffusionModel:
    """The FLUX.1 transformer `diffusion_models/<name>` with its step batcher (cached)."""
    return cached_denoiser(models_dir, name, policy, family=FAMILY, key="flux1-transformer",
                           load=_load_transformer, predict=engine.predict)


def load_vae(models_dir: Path, name: str, policy: DevicePolicy) -> Vae:
    """The FLUX AutoencoderKL `vae/<name>` (cached)."""
    return cached_vae(models_dir, name, policy, family=FAMILY, key="flux1-vae", load=_load_vae,
                      decode=engine.decode_latents_batch, latent=LATENT)


def load_text_encoder(models_dir: Path, names: Sequence[str], policy: DevicePolicy) -> TextEncoder:
    """CLIP-L and T5 from two `text_encoders/` entries (either order), with their tokenizers.
    The value's `model` is (clip, t5) and its `tokenizer` (clip's, t5's)."""
    paths = [resolve(models_dir, "text_encoders", n) for n in names]
    kinds = {_encoder_kind(p): p for p in paths}
    if set(kinds) != {"clip-l", "t5"} or len(paths) != 2:
        found = ", ".join(f"{p.name}: {_encoder_kind(p) or 'neither'}" for p in paths)
        raise ModelLoadError(f"FLUX.1 needs two text encoders, CLIP-L and T5 (in either order); "
                             f"got {found}")
    clip_path, t5_path = kinds["clip-l"], kinds["t5"]

    def load(placement: Placement) -> tuple[Any, Any]:
        clip, clip_tok = _load_encoder(clip_path, placement, "CLIPTextModel")
        t5, t5_tok = _load_encoder(t5_path, placement, "T5EncoderModel")
        return (clip, t5), (clip_tok, t5_tok)

    return cached_text_encoder([clip_path, t5_path], policy, family=FAMILY,
                               key="flux1-text-encoders", load=load, encode=engine.encode_prompts)


def _encoder_kind(path: Path) -> str | None:
    header = read_header(path)
    if header is None:
        return None
    return "t5" if t5_kind(header) else clip_kind(header)


def _config(path: Path, role: str) -> Path:
    return config_or_shipped(path, CONFIGS, role)


def _load_vae(path: Path, placement: Placement) -> Any:
    from diffusers import AutoencoderKL

    return rest(load_weights(AutoencoderKL, path, placement, _config(path, "vae"), "a FLUX VAE",
                             "vae"), placement)


def _load_transformer(path: Path, placement: Placement) -> Any:
    from diffusers import FluxTransformer2DModel

    what, folder = "a FLUX.1 transformer", "diffusion_models"
    if path.is_dir():
        model = load_weights(FluxTransformer2DModel, path, placement, path, what, folder)
    else:
        with load_errors(path, what, folder):
            model = _transformer_from_file(FluxTransformer2DModel, path, placement)
            check_complete(model, path)
    return placed_denoiser(model, placement)


def _transformer_from_file(cls: Any, path: Path, placement: Placement) -> Any:
    """Original / ComfyUI keys are converted here (diffusers' converter only reads full size);
    diffusers keys load as they are."""
    from safetensors.torch import load_file

    config = cls.load_config(str(_config(path, "transformer")))
    state = load_file(str(path))
    if keys.is_original(list(state)):
        state = keys.from_original(state)
    if not any(k.startswith("time_text_embed.guidance_embedder.") for k in state):
        config = {**config, "guidance_embeds": False}  # schnell
    if "x_embedder.weight" in state:  # Fill reads 384 channels, writes 64 (engine.is_fill)
        config = {**config, "in_channels": int(state["x_embedder.weight"].shape[1]),
                  "out_channels": int(state["proj_out.weight"].shape[0])}
    return assign_state(cls, config, state, path).to(placement.torch_dtype)


def _load_encoder(path: Path, placement: Placement, class_name: str) -> tuple[Any, Any]:
    import transformers

    return load_transformers_encoder(getattr(transformers, class_name), path, placement,
                                     f"a {class_name}")
