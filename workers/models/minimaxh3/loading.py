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
    return Parts(tokenizer=tokenizer, processor=_processor(path, tokenizer), **loaded)


def _processor(path: Path, tokenizer: Any) -> Any:
    """The folder's image + text processor (`processor/` or `tokenizer/`), else Qwen3-VL's
    defaults (16-px patches merged 2×2) over its tokenizer."""
    from workers.models.minimaxh3.tiny import tiny_processor
    from workers.models.qwenimage.vl import ImageTextProcessor

    for sub in ("processor", "tokenizer"):
        if (path / sub / "processor_config.json").is_file() \
                or (path / sub / "preprocessor_config.json").is_file():
            return ImageTextProcessor.from_pretrained(path / sub, local_files_only=True)
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
