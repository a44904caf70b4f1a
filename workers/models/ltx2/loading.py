"""Loading LTX-2 locally (`local_files_only`, nothing downloads): a diffusers LTX2Pipeline
folder (`model_index.json` + transformer / connectors / vae / audio_vae / vocoder / text_encoder /
tokenizer / scheduler, as Lightricks publishes LTX-2 for diffusers) into the components dict the
engine reads. Cached per process by the folder's path and its model_index.json's mtime.

Not yet: ComfyUI's all-in-one single file (`model.diffusion_model.` + `vae.` + `audio_vae.` +
`vocoder.` keys; recognised as a `checkpoint`): diffusers' converters need the hub config for it.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from workers.models.family import ModelLoadError

COMPONENTS = (
    "transformer",
    "connectors",
    "vae",
    "audio_vae",
    "vocoder",
    "text_encoder",
    "tokenizer",
    "scheduler",
)
_cache: dict[tuple[str, int], dict[str, Any]] = {}
_lock = threading.Lock()


def load_folder(path: Path) -> dict[str, Any]:
    """The components (float32, eval) of the LTX2Pipeline folder at `path`. Raises ModelLoadError
    naming the folder and what is missing or broken."""
    index = path / "model_index.json"
    if not index.is_file():
        raise ModelLoadError(f"{path.name}: not an LTX-2 diffusers folder (no model_index.json)")
    missing = [c for c in COMPONENTS if not (path / c).is_dir()]
    if missing:
        raise ModelLoadError(f"{path.name}: the LTX-2 folder lacks {', '.join(missing)}")
    key = (str(path.resolve()), index.stat().st_mtime_ns)
    with _lock:
        if key in _cache:
            return _cache[key]
    from diffusers import LTX2Pipeline

    try:
        pipe: Any = LTX2Pipeline.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ModelLoadError(f"cannot load the LTX-2 folder {path.name}: {exc}") from None
    components = {name: getattr(pipe, name) for name in COMPONENTS}
    for name in COMPONENTS:
        if hasattr(components[name], "eval"):
            components[name].eval()
    with _lock:
        _cache[key] = components
    return components
