"""Load Qwen-Image components from the models dir, offline, cached per worker process.

- transformer `diffusion_models/<name>`: a single file (diffusers' names, which ComfyUI keeps,
  with or without `model.diffusion_model.`) or a diffusers folder; its config is the sidecar
  `<stem>.config.json`, else the shipped Qwen-Image one (`configs/transformer/`).
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
from workers.models.cache import MODEL_CACHE
from workers.models.catalog import file_sha256, resolve
from workers.models.family import ModelLoadError
from workers.models.qwenimage import DIFFUSION_PREFIX, LATENT, engine, keys
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

FAMILY = "qwenimage"
CONFIGS = Path(__file__).parent / "configs"
ENCODER_CLASS = "Qwen2_5_VLForConditionalGeneration"


def load_diffusion_model(models_dir: Path, name: str, policy: DevicePolicy) -> DiffusionModel:
    """The Qwen-Image transformer `diffusion_models/<name>` with its step batcher (cached)."""
    path = resolve(models_dir, "diffusion_models", name)
    sha, placement = file_sha256(path), policy.placement("denoiser")
    refuse_int8(policy)

    def load() -> DiffusionModel:
        transformer = _load_transformer(path, placement)
        return denoiser_model(name=name, sha=sha, transformer=transformer, predict=engine.predict,
                              placement=placement, policy=policy, family=FAMILY)

    key = ("qwenimage-transformer", sha, placement, policy.attention)
    return MODEL_CACHE.get_or_load(key, load)


def load_vae(models_dir: Path, name: str, policy: DevicePolicy) -> Vae:
    """The Qwen-Image AutoencoderKLQwenImage `vae/<name>` (cached)."""
    path = resolve(models_dir, "vae", name)
    sha, placement = file_sha256(path), policy.placement("vae")

    def load() -> Vae:
        module = rest(_load_vae(path, placement), placement)
        return vae_model(name=name, sha=sha, module=module, placement=placement, policy=policy,
                         decode=engine.decode_latents_batch, latent=LATENT, family=FAMILY)

    key = ("qwenimage-vae", sha, placement, policy.vae_tiling, policy.vae_slicing)
    return MODEL_CACHE.get_or_load(key, load)


def load_text_encoder(models_dir: Path, names: Sequence[str], policy: DevicePolicy) -> TextEncoder:
    """Qwen2.5-VL from one `text_encoders/` entry, with its tokenizer (cached)."""
    if len(names) != 1:
        raise ModelLoadError(f"Qwen-Image uses one text encoder (a Qwen2.5-VL), got "
                             f"{len(names)} files: {', '.join(names)}")
    refuse_int8(policy)
    path = resolve(models_dir, "text_encoders", names[0])
    sha, placement = file_sha256(path), policy.placement("text-encoder")

    def load() -> TextEncoder:
        model, tokenizer = _load_encoder(path, placement)
        return text_encoder_model(name=path.name, sha=sha, model=model, tokenizer=tokenizer,
                                  placement=placement, policy=policy,
                                  encode=engine.encode_prompts, family=FAMILY)

    return MODEL_CACHE.get_or_load(("qwenimage-text-encoder", sha, placement), load)


def _config(path: Path, role: str) -> Path:
    own = sidecar(path, ".config.json")
    return own if own.is_file() else CONFIGS / role / "config.json"


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
    if placement.device == "cpu":
        own_storage(model)
    return model.to(placement.device).eval()


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
    """`cls` built from its config with its parameters on the meta device (computed tables such
    as the rotary frequencies stay real), its weights assigned from the file (a `prefix` such as
    ComfyUI's `model.diffusion_model.` dropped); every key must match."""
    from accelerate import init_empty_weights
    from safetensors.torch import load_file

    state = {k.removeprefix(prefix) if prefix else k: v for k, v in load_file(str(path)).items()}
    if keys.is_original(state):  # a VAE in the original (Wan) layout
        state = keys.from_original(state)
    with init_empty_weights(include_buffers=False):
        model = cls.from_config(cls.load_config(str(config_path)))
    result = model.load_state_dict(state, strict=False, assign=True)
    if result.missing_keys or result.unexpected_keys:
        raise ModelLoadError(
            f"{path.name} does not match its config {config_path.name}: missing "
            f"{result.missing_keys[:3]}, unexpected {result.unexpected_keys[:3]}")
    return model.to(placement.torch_dtype)


def _load_encoder(path: Path, placement: Placement) -> tuple[Any, Any]:
    import transformers

    cls = getattr(transformers, ENCODER_CLASS)
    tok_dir = path if path.is_dir() else sidecar(path, ".tokenizer")
    if not (tok_dir / "tokenizer_config.json").is_file():
        raise ModelLoadError(f"no tokenizer for text encoder {path.name}: put its tokenizer "
                             f"files (tokenizer.json, tokenizer_config.json, …) in {tok_dir}/")
    with load_errors(path, "a Qwen2.5-VL text encoder", "text_encoders"):
        tokenizer = transformers.AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
        if path.is_dir():
            model = cls.from_pretrained(path, local_files_only=True, dtype=placement.torch_dtype)
        else:
            model = _encoder_from_file(cls, path, placement)
        check_complete(model, path)
    if tokenizer.pad_token is None:
        raise ModelLoadError(f"the tokenizer in {tok_dir} needs a pad_token")
    return rest(model, placement), tokenizer


def _encoder_from_file(cls: Any, path: Path, placement: Placement) -> Any:
    """A transformers model from one weight file and its sidecar config: both linked into a
    temporary folder laid out as from_pretrained reads one (its key conversions, ties and
    dtypes as for a folder)."""
    import tempfile

    config_path = sidecar(path, ".config.json")
    if not config_path.is_file():
        raise ModelLoadError(f"a single-file text encoder needs its transformers config: put "
                             f"it in {config_path} (or use the encoder's folder)")
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").symlink_to(config_path.resolve())
        (Path(folder) / "model.safetensors").symlink_to(path.resolve())
        return cls.from_pretrained(folder, local_files_only=True, dtype=placement.torch_dtype)
