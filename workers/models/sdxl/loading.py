"""Load SDXL from the models dir, offline, cached per worker process (keyed by file content).

- checkpoint `checkpoints/<name>`: the all-in-one file (original keys) through diffusers'
  single-file machinery (`StableDiffusionXLPipeline.from_single_file`, whose converters read
  the original layout) with a local diffusers folder of configs: `<stem>.diffusers/` beside the
  file when present (the tiny stack's), else the full-size SDXL base configs and CLIP
  tokenizers shipped in `configs/`. Nothing downloads. A `v_pred` key (ComfyUI's mark) makes the
  UNet a v-prediction one; else epsilon.
- UNet alone `diffusion_models/<name>` (original keys, with or without `model.diffusion_model.`,
  or a diffusers folder), and the SDXL VAE alone `vae/<name>`; their config is the sidecar
  `<stem>.config.json`, else the shipped one.
SDXL's text encoders come from its checkpoint (ComfyUI's CheckpointLoaderSimple's CLIP).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workers.device.policy import DevicePolicy, Placement
from workers.models.cache import MODEL_CACHE
from workers.models.catalog import file_sha256, resolve
from workers.models.family import ModelLoadError
from workers.models.header import read_header
from workers.models.sdxl import LATENT, UNET, V_PRED, engine
from workers.models.values import DiffusionModel, TextEncoder, Vae
from workers.models.weights import (
    check_complete,
    config_or_shipped,
    denoiser_model,
    load_errors,
    load_weights,
    placed_denoiser,
    refuse_int8,
    rest,
    sidecar,
    text_encoder_model,
    vae_model,
)

FAMILY = "sdxl"
CONFIGS = Path(__file__).parent / "configs"


def load_checkpoint(models_dir: Path, name: str,
                    policy: DevicePolicy) -> tuple[DiffusionModel, TextEncoder, Vae]:
    """The UNet (with its step batcher), both text encoders and the VAE of the all-in-one
    `checkpoints/<name>` (cached as one)."""
    path = resolve(models_dir, "checkpoints", name)
    refuse_int8(policy)
    sha = file_sha256(path)
    places = {role: policy.placement(role) for role in ("denoiser", "text-encoder", "vae")}

    def load() -> tuple[DiffusionModel, TextEncoder, Vae]:
        pipe = _pipeline(path, places["denoiser"])
        unet = _unet(pipe.unet, places["denoiser"], _v_pred(path))
        model = denoiser_model(name=name, sha=sha, transformer=unet, predict=engine.predict,
                               placement=places["denoiser"], policy=policy, family=FAMILY)
        encoders = tuple(rest(m.to(places["text-encoder"].torch_dtype), places["text-encoder"])
                         for m in (pipe.text_encoder, pipe.text_encoder_2))
        encoder = _text_encoder(name, sha, encoders, (pipe.tokenizer, pipe.tokenizer_2),
                                places["text-encoder"], policy)
        return model, encoder, _vae(name, sha, pipe.vae, places["vae"], policy)

    key = ("sdxl-checkpoint", sha, tuple(places.values()), policy.attention, policy.vae_tiling,
           policy.vae_slicing)
    return MODEL_CACHE.get_or_load(key, load)


def load_diffusion_model(models_dir: Path, name: str, policy: DevicePolicy) -> DiffusionModel:
    """The SDXL UNet `diffusion_models/<name>` alone, with its step batcher (cached)."""
    from diffusers import UNet2DConditionModel

    path = resolve(models_dir, "diffusion_models", name)
    refuse_int8(policy)
    sha, placement = file_sha256(path), policy.placement("denoiser")

    def load() -> DiffusionModel:
        what, folder = "an SDXL UNet", "diffusion_models"
        if path.is_dir():
            module = load_weights(UNet2DConditionModel, path, placement, path, what, folder)
        else:
            with load_errors(path, what, folder):
                module = _unet_from_file(UNet2DConditionModel, path, placement)
                check_complete(module, path)
        unet = _unet(module, placement, _v_pred(path))
        return denoiser_model(name=name, sha=sha, transformer=unet, predict=engine.predict,
                              placement=placement, policy=policy, family=FAMILY)

    return MODEL_CACHE.get_or_load(("sdxl-unet", sha, placement, policy.attention), load)


def load_vae(models_dir: Path, name: str, policy: DevicePolicy) -> Vae:
    """The SDXL AutoencoderKL `vae/<name>` alone (cached)."""
    from diffusers import AutoencoderKL

    path = resolve(models_dir, "vae", name)
    sha, placement = file_sha256(path), policy.placement("vae")

    def load() -> Vae:
        config = _config(path, "vae")
        module = load_weights(AutoencoderKL, path, placement, config, "an SDXL VAE", "vae")
        return _vae(name, sha, module, placement, policy)

    key = ("sdxl-vae", sha, placement, policy.vae_tiling, policy.vae_slicing)
    return MODEL_CACHE.get_or_load(key, load)


def load_text_encoder(models_dir: Path, names: Sequence[str], policy: DevicePolicy) -> TextEncoder:
    raise ModelLoadError("SDXL's text encoders load from its checkpoint: use load/checkpoint "
                         "(ComfyUI's CheckpointLoaderSimple) and its `encoder` output")


def _pipeline(path: Path, placement: Placement) -> Any:
    """diffusers' StableDiffusionXLPipeline from the single file, offline, on CPU."""
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline
    from transformers import CLIPTokenizer

    configs = sidecar(path, ".diffusers")
    configs = configs if configs.is_dir() else CONFIGS
    with load_errors(path, "an SDXL checkpoint", "checkpoints"):
        tokenizer = CLIPTokenizer.from_pretrained(configs / "tokenizer", local_files_only=True)
        second = configs / "tokenizer_2"  # bigG's pads with "!" (the shipped one shares CLIP's)
        if second.is_dir():
            tokenizer_2 = CLIPTokenizer.from_pretrained(second, local_files_only=True)
        else:
            tokenizer_2 = CLIPTokenizer.from_pretrained(configs / "tokenizer", pad_token="!",
                                                        local_files_only=True)
        pipe = StableDiffusionXLPipeline.from_single_file(
            str(path), config=str(configs), local_files_only=True,
            torch_dtype=placement.torch_dtype, tokenizer=tokenizer, tokenizer_2=tokenizer_2,
            scheduler=EulerDiscreteScheduler.from_config(engine.scheduler_config()),
            add_watermarker=False)
        for module in (pipe.unet, pipe.vae, pipe.text_encoder, pipe.text_encoder_2):
            check_complete(module, path)
    return pipe


def _unet_from_file(cls: Any, path: Path, placement: Placement) -> Any:
    """A UNet file in the original layout; ComfyUI saves it without its checkpoint prefix."""
    from safetensors.torch import load_file

    state = load_file(str(path))
    if not any(k.startswith(UNET) for k in state):
        state = {UNET + k: v for k, v in state.items()}
    return cls.from_single_file(state, config=str(_config(path, "unet")), local_files_only=True,
                                torch_dtype=placement.torch_dtype)


def _unet(module: Any, placement: Placement, v_pred: bool) -> Any:
    module.prediction_type = engine.V_PREDICTION if v_pred else engine.EPSILON
    return placed_denoiser(module, placement)


def _vae(name: str, sha: str, module: Any, placement: Placement, policy: DevicePolicy) -> Vae:
    """The VAE value with its coalescer of decodes. SDXL's VAE overflows in float16: like the
    pipeline (`force_upcast`), it runs in float32 then."""
    import torch

    if module.config.get("force_upcast") and placement.torch_dtype == torch.float16:
        module = module.to(torch.float32)
    return vae_model(name=name, sha=sha, module=rest(module, placement), placement=placement,
                     policy=policy, decode=engine.decode_latents_batch, latent=LATENT,
                     family=FAMILY)


def _text_encoder(name: str, sha: str, models: tuple[Any, ...], tokenizers: tuple[Any, Any],
                  placement: Placement, policy: DevicePolicy) -> TextEncoder:
    """Both CLIPs as one value (`model` (CLIP-L, bigG), `tokenizer` theirs), batching encodes."""
    return text_encoder_model(name=name, sha=sha, model=models, tokenizer=tokenizers,
                              placement=placement, policy=policy, encode=engine.encode_prompts,
                              family=FAMILY)


def _v_pred(path: Path) -> bool:
    header = read_header(path)
    return header is not None and V_PRED in header.shapes


def _config(path: Path, role: str) -> Path:
    return config_or_shipped(path, CONFIGS, role)
