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
    `text_encoder/`, `tokenizer/`); a ModelLoadError naming the missing or unreadable part."""
    from diffusers import (
        AutoencoderKLMiniMaxH3,
        AutoencoderKLMiniMaxH3Audio,
        MiniMaxH3Transformer3DModel,
    )
    from transformers import AutoTokenizer, Qwen3VLForConditionalGeneration

    from workers.models.minimaxh3.tiny import tiny_processor

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
    return Parts(tokenizer=tokenizer, processor=tiny_processor(tokenizer), **loaded)
