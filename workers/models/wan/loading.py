"""Load Wan components from the models dir, offline, cached per worker process.

- transformer `diffusion_models/<name>`: a single file (diffusers' names, with or without
  ComfyUI's `model.diffusion_model.`, or the original / ComfyUI layout, which diffusers' own
  `convert_wan_transformer_to_diffusers` reads) or a diffusers folder; its config is the sidecar
  `<stem>.config.json`, else read from the weights' shapes (the published models differ only in
  width, depth and input channels; heads of 128).
- VAE `vae/<name>`: AutoencoderKLWan in diffusers' or the original keys, or a folder; config as
  above, else Wan 2.1's (16 channels), or for 48 latent channels the Wan 2.2 VAE's (`VAE22`,
  diffusers' Wan2.2-TI2V-5B vae/config.json). The original keys of either (ComfyUI's
  `wan_2.1_vae` / `wan2.2_vae.safetensors`) are told apart by their latent channels, not names.
- text encoder `text_encoders/<name>`: UMT5EncoderModel, a transformers folder with its
  tokenizer, or a single file (`encoder.block.N`) with `<stem>.config.json` and
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
from workers.models.header import read_header
from workers.models.values import DiffusionModel, TextEncoder, Vae
from workers.models.wan import DIFFUSION_PREFIX, LATENT, engine, keys
from workers.models.weights import (
    check_complete,
    denoiser_model,
    load_errors,
    own_storage,
    refuse_int8,
    rest,
    sidecar,
    text_encoder_model,
    vae_model,
)

FAMILY = "wan"
HEAD_DIM = 128  # every published Wan transformer's attention head width
# The Wan 2.2 VAE (TI2V-5B's), as Wan-AI/Wan2.2-TI2V-5B-Diffusers vae/config.json has it: the
# defaults for a 48-channel Wan VAE file without a sidecar config.
VAE22: dict[str, Any] = {
    "base_dim": 160, "decoder_base_dim": 256, "z_dim": 48, "dim_mult": [1, 2, 4, 4],
    "num_res_blocks": 2, "temperal_downsample": [False, True, True], "is_residual": True,
    "in_channels": 12, "out_channels": 12, "patch_size": 2, "scale_factor_spatial": 16,
    "scale_factor_temporal": 4, "clip_output": False,
    "latents_mean": [-0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557,
                     -0.1382, 0.0542, 0.2813, 0.0891, 0.1570, -0.0098, 0.0375, -0.1825,
                     -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108, -0.2158, 0.2502,
                     -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230,
                     -0.0313, -0.1649, 0.0117, 0.0723, -0.2839, -0.2083, -0.0520, 0.3748,
                     0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667],
    "latents_std": [0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013, 0.8158,
                    1.0344, 0.5894, 1.0901, 0.6885, 0.6165, 0.8454, 0.4978, 0.5759, 0.3523,
                    0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659, 0.7069, 0.5338, 0.4889,
                    0.4917, 0.4069, 0.4999, 0.6866, 0.4093, 0.5709, 0.6065, 0.6415, 0.4944,
                    0.5726, 1.2042, 0.5458, 1.6887, 0.3971, 1.0600, 0.3943, 0.5537, 0.5444,
                    0.4089, 0.7468, 0.7744]}


def load_diffusion_model(models_dir: Path, name: str, policy: DevicePolicy) -> DiffusionModel:
    """The Wan transformer `diffusion_models/<name>` with its step batcher (cached)."""
    path = resolve(models_dir, "diffusion_models", name)
    sha, placement = file_sha256(path), policy.placement("denoiser")
    refuse_int8(policy)

    def load() -> DiffusionModel:
        transformer = _load_transformer(path, placement)
        return denoiser_model(name=name, sha=sha, transformer=transformer, predict=engine.predict,
                              placement=placement, policy=policy, family=FAMILY)

    return MODEL_CACHE.get_or_load(("wan-transformer", sha, placement, policy.attention), load)


def load_vae(models_dir: Path, name: str, policy: DevicePolicy) -> Vae:
    """The AutoencoderKLWan `vae/<name>` (cached)."""
    path = resolve(models_dir, "vae", name)
    sha, placement = file_sha256(path), policy.placement("vae")

    def load() -> Vae:
        module = rest(_load_vae(path, placement), placement)
        return vae_model(name=name, sha=sha, module=module, placement=placement, policy=policy,
                         decode=engine.decode_latents_batch, latent=LATENT, family=FAMILY)

    key = ("wan-vae", sha, placement, policy.vae_tiling, policy.vae_slicing)
    return MODEL_CACHE.get_or_load(key, load)


def load_text_encoder(models_dir: Path, names: Sequence[str], policy: DevicePolicy) -> TextEncoder:
    """UMT5 from one `text_encoders/` entry, with its tokenizer (cached)."""
    if len(names) != 1:
        raise ModelLoadError(f"Wan uses one text encoder (UMT5), got {len(names)} files: "
                             f"{', '.join(names)}")
    refuse_int8(policy)
    path = resolve(models_dir, "text_encoders", names[0])
    sha, placement = file_sha256(path), policy.placement("text-encoder")

    def load() -> TextEncoder:
        model, tokenizer = _load_encoder(path, placement)
        return text_encoder_model(name=path.name, sha=sha, model=model, tokenizer=tokenizer,
                                  placement=placement, policy=policy,
                                  encode=engine.encode_prompts, family=FAMILY)

    return MODEL_CACHE.get_or_load(("wan-text-encoder", sha, placement), load)


def transformer_config_from_shapes(shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """WanTransformer3DModel's config read off diffusers-named weights (the defaults of the
    class are Wan 2.1 14B's; width, depth, FFN, text width and input channels vary)."""
    patch = shapes["patch_embedding.weight"]  # [inner, in, 1, 2, 2]
    blocks = {int(k.split(".")[1]) for k in shapes if k.startswith("blocks.")}
    return {"in_channels": patch[1], "num_attention_heads": patch[0] // HEAD_DIM,
            "attention_head_dim": HEAD_DIM, "num_layers": len(blocks),
            "ffn_dim": shapes["blocks.0.ffn.net.0.proj.weight"][0],
            "text_dim": shapes["condition_embedder.text_embedder.linear_1.weight"][1],
            "image_dim": (shapes["condition_embedder.image_embedder.ff.net.0.proj.weight"][1]
                          if "condition_embedder.image_embedder.ff.net.0.proj.weight" in shapes
                          else None)}


def _state(path: Path, prefix: str) -> dict[str, Any]:
    from safetensors.torch import load_file

    state = {k.removeprefix(prefix): v for k, v in load_file(str(path)).items()}
    return state


def _load_transformer(path: Path, placement: Placement) -> Any:
    from diffusers import WanTransformer3DModel

    what, folder = "a Wan transformer", "diffusion_models"
    with load_errors(path, what, folder):
        if path.is_dir():
            model = WanTransformer3DModel.from_pretrained(path, local_files_only=True,
                                                          torch_dtype=placement.torch_dtype)
        else:
            state = _state(path, DIFFUSION_PREFIX)
            if keys.is_original(state):  # the original / ComfyUI layout
                state = keys.from_original(state)
            own = sidecar(path, ".config.json")
            config = (WanTransformer3DModel.load_config(str(own)) if own.is_file()
                      else transformer_config_from_shapes({k: tuple(v.shape)
                                                           for k, v in state.items()}))
            model = _assign(WanTransformer3DModel, config, state, path, placement)
        check_complete(model, path)
    if placement.device == "cpu":
        own_storage(model)
    return model.to(placement.device).eval()


def _load_vae(path: Path, placement: Placement) -> Any:
    from diffusers import AutoencoderKLWan

    what, folder = "a Wan VAE", "vae"
    with load_errors(path, what, folder):
        if path.is_dir():
            model = AutoencoderKLWan.from_pretrained(path, local_files_only=True,
                                                     torch_dtype=placement.torch_dtype)
        else:
            state = _state(path, "")
            z_dim = _vae_z_dim(state)
            if any(k.startswith(("decoder.conv1.", "decoder.upsamples.")) for k in state):
                if z_dim == VAE22["z_dim"]:  # the Wan 2.2 VAE (ComfyUI's wan2.2_vae)
                    state = keys.vae22_from_original(state)
                else:
                    from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers

                    state = convert_wan_vae_to_diffusers(state)
            own = sidecar(path, ".config.json")
            config = (AutoencoderKLWan.load_config(str(own)) if own.is_file()
                      else dict(VAE22) if z_dim == VAE22["z_dim"] else {})
            model = _assign(AutoencoderKLWan, config, state, path, placement)
        check_complete(model, path)
    return model


def _vae_z_dim(state: dict[str, Any]) -> int | None:
    """A Wan VAE's latent channels from its decoder's first convolution (either key layout)."""
    for key in ("decoder.conv_in.weight", "decoder.conv1.weight"):
        if key in state:
            return int(state[key].shape[1])
    return None


def _assign(cls: Any, config: dict[str, Any], state: dict[str, Any], path: Path,
            placement: Placement) -> Any:
    """`cls` built from `config` with its parameters on the meta device (computed tables such
    as the rotary frequencies stay real), its weights assigned from `state`; every key must
    match."""
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):
        model = cls.from_config(config)
    result = model.load_state_dict(state, strict=False, assign=True)
    if result.missing_keys or result.unexpected_keys:
        raise ModelLoadError(
            f"{path.name} does not match its config: missing {result.missing_keys[:3]}, "
            f"unexpected {result.unexpected_keys[:3]}")
    return model.to(placement.torch_dtype)


def _load_encoder(path: Path, placement: Placement) -> tuple[Any, Any]:
    import transformers

    tok_dir = path if path.is_dir() else sidecar(path, ".tokenizer")
    if not (tok_dir / "tokenizer_config.json").is_file():
        raise ModelLoadError(f"no tokenizer for text encoder {path.name}: put its tokenizer "
                             f"files (tokenizer.json, tokenizer_config.json, …) in {tok_dir}/")
    with load_errors(path, "a UMT5 text encoder", "text_encoders"):
        tokenizer = transformers.AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
        cls = transformers.UMT5EncoderModel
        if path.is_dir():
            model = cls.from_pretrained(path, local_files_only=True, dtype=placement.torch_dtype)
        else:
            model = _encoder_from_file(cls, path, placement)
        check_complete(model, path)
    if tokenizer.pad_token is None:
        raise ModelLoadError(f"the tokenizer in {tok_dir} needs a pad_token")
    return rest(model, placement), tokenizer


def _encoder_from_file(cls: Any, path: Path, placement: Placement) -> Any:
    """A transformers model from one weight file and its sidecar config, both linked into a
    temporary folder laid out as from_pretrained reads one."""
    import tempfile

    config_path = sidecar(path, ".config.json")
    if not config_path.is_file():
        raise ModelLoadError(f"a single-file text encoder needs its transformers config: put "
                             f"it in {config_path} (or use the encoder's folder)")
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").symlink_to(config_path.resolve())
        (Path(folder) / "model.safetensors").symlink_to(path.resolve())
        return cls.from_pretrained(folder, local_files_only=True, dtype=placement.torch_dtype)


def is_wan_vae_file(path: Path) -> bool:
    """Whether the file at `path` is a Wan VAE by its contents (also when the catalog lists it
    under another family first: a 16-channel Wan VAE is Qwen-Image's too)."""
    from workers.models.wan import vae_channels

    header = read_header(path)
    return header is not None and vae_channels(header) is not None
