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
from workers.models.cache import MODEL_CACHE
from workers.models.catalog import file_sha256, resolve
from workers.models.family import ModelLoadError
from workers.models.flux1 import LATENT, clip_kind, engine, keys, t5_kind
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

FAMILY = "flux1"
CONFIGS = Path(__file__).parent / "configs"


def load_diffusion_model(models_dir: Path, name: str, policy: DevicePolicy) -> DiffusionModel:
    """The FLUX.1 transformer `diffusion_models/<name>` with its step batcher (cached)."""
    path = resolve(models_dir, "diffusion_models", name)
    sha, placement = file_sha256(path), policy.placement("denoiser")
    refuse_int8(policy)

    def load() -> DiffusionModel:
        transformer = _load_transformer(path, placement)
        return denoiser_model(name=name, sha=sha, transformer=transformer, predict=engine.predict,
                              placement=placement, policy=policy, family=FAMILY)

    return MODEL_CACHE.get_or_load(("flux1-transformer", sha, placement, policy.attention), load)


def load_vae(models_dir: Path, name: str, policy: DevicePolicy) -> Vae:
    """The FLUX AutoencoderKL `vae/<name>` (cached)."""
    from diffusers import AutoencoderKL

    path = resolve(models_dir, "vae", name)
    sha, placement = file_sha256(path), policy.placement("vae")

    def load() -> Vae:
        config = _config(path, "vae")
        module = rest(load_weights(AutoencoderKL, path, placement, config, "a FLUX VAE", "vae"),
                      placement)
        return vae_model(name=name, sha=sha, module=module, placement=placement, policy=policy,
                         decode=engine.decode_latents_batch, latent=LATENT, family=FAMILY)

    key = ("flux1-vae", sha, placement, policy.vae_tiling, policy.vae_slicing)
    return MODEL_CACHE.get_or_load(key, load)


def load_text_encoder(models_dir: Path, names: Sequence[str], policy: DevicePolicy) -> TextEncoder:
    """CLIP-L and T5 from two `text_encoders/` entries (either order), with their tokenizers.
    The value's `model` is (clip, t5) and its `tokenizer` (clip's, t5's)."""
    refuse_int8(policy)
    paths = [resolve(models_dir, "text_encoders", n) for n in names]
    kinds = {_encoder_kind(p): p for p in paths}
    if set(kinds) != {"clip-l", "t5"} or len(paths) != 2:
        found = ", ".join(f"{p.name}: {_encoder_kind(p) or 'neither'}" for p in paths)
        raise ModelLoadError(f"FLUX.1 needs two text encoders, CLIP-L and T5 (in either order); "
                             f"got {found}")
    clip_path, t5_path = kinds["clip-l"], kinds["t5"]
    sha = file_sha256(clip_path) + file_sha256(t5_path)
    placement = policy.placement("text-encoder")

    def load() -> TextEncoder:
        clip, clip_tok = _load_encoder(clip_path, placement, "CLIPTextModel")
        t5, t5_tok = _load_encoder(t5_path, placement, "T5EncoderModel")
        return text_encoder_model(name=f"{clip_path.name} + {t5_path.name}", sha=sha,
                                  model=(clip, t5), tokenizer=(clip_tok, t5_tok),
                                  placement=placement, policy=policy,
                                  encode=engine.encode_prompts, family=FAMILY)

    return MODEL_CACHE.get_or_load(("flux1-text-encoders", sha, placement), load)


def _encoder_kind(path: Path) -> str | None:
    header = read_header(path)
    if header is None:
        return None
    return "t5" if t5_kind(header) else clip_kind(header)


def _config(path: Path, role: str) -> Path:
    own = sidecar(path, ".config.json")
    return own if own.is_file() else CONFIGS / role / "config.json"


def _load_transformer(path: Path, placement: Placement) -> Any:
    from diffusers import FluxTransformer2DModel

    what, folder = "a FLUX.1 transformer", "diffusion_models"
    if path.is_dir():
        model = load_weights(FluxTransformer2DModel, path, placement, path, what, folder)
    else:
        with load_errors(path, what, folder):
            model = _transformer_from_file(FluxTransformer2DModel, path, placement)
            check_complete(model, path)
    if placement.device == "cpu":
        own_storage(model)
    return model.to(placement.device).eval()


def _transformer_from_file(cls: Any, path: Path, placement: Placement) -> Any:
    """Original / ComfyUI keys are converted here (diffusers' converter only reads full size);
    diffusers keys load as they are."""
    import torch
    from safetensors.torch import load_file

    config = cls.load_config(str(_config(path, "transformer")))
    state = load_file(str(path))
    if keys.is_original(list(state)):
        state = keys.from_original(state)
    if not any(k.startswith("time_text_embed.guidance_embedder.") for k in state):
        config = {**config, "guidance_embeds": False}  # schnell
    with torch.device("meta"):
        model = cls.from_config(config)
    result = model.load_state_dict(state, strict=False, assign=True)
    if result.missing_keys or result.unexpected_keys:
        raise ModelLoadError(
            f"{path.name} does not match its config: missing {result.missing_keys[:3]}, "
            f"unexpected {result.unexpected_keys[:3]}")
    return model.to(placement.torch_dtype)


def _load_encoder(path: Path, placement: Placement, class_name: str) -> tuple[Any, Any]:
    import transformers

    cls = getattr(transformers, class_name)
    tok_dir = path if path.is_dir() else sidecar(path, ".tokenizer")
    if not (tok_dir / "tokenizer_config.json").is_file():
        raise ModelLoadError(f"no tokenizer for text encoder {path.name}: put its tokenizer "
                             f"files (tokenizer.json, tokenizer_config.json, …) in {tok_dir}/")
    with load_errors(path, f"a {class_name}", "text_encoders"):
        tokenizer = transformers.AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
        if path.is_dir():
            model = cls.from_pretrained(path, local_files_only=True, dtype=placement.torch_dtype)
        else:
            model = _encoder_from_file(cls, path, placement)
        check_complete(model, path)
    return rest(model, placement), tokenizer


def _encoder_from_file(cls: Any, path: Path, placement: Placement) -> Any:
    """A transformers model from one weight file and its sidecar config: both linked into a
    temporary folder laid out as from_pretrained reads one (ties, buffers and dtypes as for a
    folder)."""
    import tempfile

    config_path = sidecar(path, ".config.json")
    if not config_path.is_file():
        raise ModelLoadError(f"a single-file text encoder needs its transformers config: put "
                             f"it in {config_path} (or use the encoder's folder)")
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").symlink_to(config_path.resolve())
        (Path(folder) / "model.safetensors").symlink_to(path.resolve())
        return cls.from_pretrained(folder, local_files_only=True, dtype=placement.torch_dtype)
