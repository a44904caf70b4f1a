"""Loading a MiniMax-H3 stack from a diffusers folder (local files only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from workers.models.family import ModelLoadError
from workers.models.minimaxh3.engine import Parts
from workers.models.weights import own_storage


def load_folder(path: Path, dtype: torch.dtype = torch.float32) -> Parts:
    """The stack (on CPU) of a diffusers MiniMax-H3 folder (`transformer/`, `vae/`, `audio_vae/`,
    `text_encoder/`, `tokenizer/`, a `processor/` or the processor's config in `tokenizer/`); a
    ModelLoadError naming the missing or unreadable part."""
    from diffusers import (
        AutoencoderKLMiniMaxH3,
        AutoencoderKLMiniMaxH3Audio,
        MiniMaxH3Transformer3DModel,
    )
    from transformers import AutoTokenizer, Qwen3VLForConditionalGeneration

    path = Path(path)
    loaded: dict[str, Any] = {}
    for name, cls in (("transformer", MiniMaxH3Transformer3DModel),
                      ("vae", AutoencoderKLMiniMaxH3), ("audio_vae", AutoencoderKLMiniMaxH3Audio),
                      ("text_encoder", Qwen3VLForConditionalGeneration)):
        if not (path / name / "config.json").is_file():
            raise ModelLoadError(f"{path.name}/ is not a MiniMax-H3 folder: it has no {name}/")
        try:
            loaded[name] = cls.from_pretrained(path / name, torch_dtype=dtype,
                                               local_files_only=True).eval()
        except (OSError, ValueError, RuntimeError) as exc:
            raise ModelLoadError(f"cannot load {path.name}/{name}: {exc}") from None
        own_storage(loaded[name])  # out of the file's mmap: CPU kernels round by alignment
    tokenizer = AutoTokenizer.from_pretrained(path / "tokenizer", local_files_only=True)
    return Parts(tokenizer=tokenizer,
                 processor=_processor((path / "processor", path / "tokenizer"), tokenizer),
                 keyframe_partition=(path / "transformer_ref").is_dir(), **loaded)


def _processor(folders: tuple[Path, ...], tokenizer: Any) -> Any:
    """The first of `folders` with an image + text processor's config, else Qwen3-VL's
    defaults (16-px patches merged 2×2) over its tokenizer."""
    from workers.models.minimaxh3.tiny import tiny_processor
    from workers.models.qwenimage.vl import ImageTextProcessor

    for folder in folders:
        if (folder / "processor_config.json").is_file() \
                or (folder / "preprocessor_config.json").is_file():
            return ImageTextProcessor.from_pretrained(folder, local_files_only=True)
    return tiny_processor(tokenizer)


def load_transformer_file(path: Path, dtype: torch.dtype = torch.float32) -> Any:
    """MiniMax-H3's transformer from ComfyUI's single file (`keys`), built with its
    `<stem>.config.json` when there is one, else the released config (the class defaults); a
    ModelLoadError for ComfyUI's quantized files (int8 "convrot", fp8, nvfp4) and the pruned
    transformer (`adaln_t_table` instead of the time embedder), which this farm cannot run."""
    import json

    from diffusers import MiniMaxH3Transformer3DModel
    from safetensors.torch import load_file

    from workers.models.minimaxh3 import keys
    from workers.models.weights import load_errors, sidecar

    with load_errors(path, "MiniMax-H3's transformer", "diffusion_models"):
        state = load_file(str(path))
    if any(key.endswith(keys.QUANTIZED) for key in state):
        raise ModelLoadError(
            f"{path.name} holds quantized weights (ComfyUI's int8 \"convrot\" / fp8 / nvfp4 layers "
            "with their scales): MiniMax-H3 loads unquantized files here (bf16, fp16 or fp32)")
    if any(key.endswith(keys.PRUNED) for key in state):
        raise ModelLoadError(
            f"{path.name} is a pruned MiniMax-H3 transformer ({keys.PRUNED} instead of the time "
            "embedder), which diffusers' MiniMaxH3Transformer3DModel cannot run: use the "
            "unpruned one")
    config_file = sidecar(path, ".config.json")
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    config = {k: v for k, v in config.items() if not k.startswith("_")}
    with load_errors(path, "MiniMax-H3's transformer", "diffusion_models"):
        model: Any = MiniMaxH3Transformer3DModel(**config)
        model.load_state_dict(keys.to_diffusers(state, dict(model.config)), strict=True)
    own_storage(model)
    return model.to(dtype).eval()


FILE_ROLES = ("diffusion_model", "vae", "audio_vae", "text_encoder")  # ComfyUI's four loaders


def load_files(paths: dict[str, Path], dtype: torch.dtype = torch.float32) -> Parts:
    """The stack of ComfyUI's four separate parts (`paths` by FILE_ROLES): the transformer as
    ComfyUI's single file (load_transformer_file) or a diffusers component folder; the video VAE,
    the audio VAE and the Qwen3-VL (with its tokenizer and processor) as diffusers component
    folders. A ModelLoadError names a quantized file, or a single file of a part whose ComfyUI
    keys the farm does not read yet."""
    from diffusers import (
        AutoencoderKLMiniMaxH3,
        AutoencoderKLMiniMaxH3Audio,
        MiniMaxH3Transformer3DModel,
    )
    from transformers import AutoTokenizer, Qwen3VLForConditionalGeneration

    classes = {"diffusion_model": MiniMaxH3Transformer3DModel, "vae": AutoencoderKLMiniMaxH3,
               "audio_vae": AutoencoderKLMiniMaxH3Audio,
               "text_encoder": Qwen3VLForConditionalGeneration}
    loaded: dict[str, Any] = {}
    for role in FILE_ROLES:
        path = paths[role]
        if path.is_file() and role == "diffusion_model":
            loaded[role] = load_transformer_file(path, dtype)
            continue
        if path.is_file():
            _refuse_file(path, role)
        try:
            loaded[role] = classes[role].from_pretrained(path, torch_dtype=dtype,
                                                         local_files_only=True).eval()
        except (OSError, ValueError, RuntimeError) as exc:
            raise ModelLoadError(f"cannot load {path.name}/ as MiniMax-H3's {role}: {exc}") from None
        own_storage(loaded[role])
    try:
        tokenizer = AutoTokenizer.from_pretrained(paths["text_encoder"], local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{paths['text_encoder'].name}/ has no Qwen3-VL tokenizer: {exc}") \
            from None
    return Parts(transformer=loaded["diffusion_model"], vae=loaded["vae"],
                 audio_vae=loaded["audio_vae"], text_encoder=loaded["text_encoder"],
                 tokenizer=tokenizer, processor=_processor((paths["text_encoder"],), tokenizer))


def _refuse_file(path: Path, role: str) -> None:
    """A single file of the VAEs or the text encoder: refused, as quantized when it is."""
    from safetensors import safe_open

    from workers.models.minimaxh3 import keys
    from workers.models.weights import load_errors

    folder = "vae" if "vae" in role else "text_encoders"
    with load_errors(path, f"MiniMax-H3's {role}", folder), safe_open(str(path), "pt") as file:
        names = list(file.keys())
    if any(name.endswith(keys.QUANTIZED) for name in names):
        raise ModelLoadError(
            f"{path.name} holds quantized weights (ComfyUI's int8 \"convrot\" / fp8 / nvfp4 layers "
            "with their scales): MiniMax-H3 loads unquantized parts here")
    raise ModelLoadError(f"{path.name}: ComfyUI's single-file MiniMax-H3 {role} is not read yet; "
                         f"give its diffusers folder ({path.stem}/ with config.json and weights)")
