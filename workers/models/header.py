"""What a model file says about itself, read without loading it. TORCH-FREE (the catalog's scan
runs in every heartbeat; the web side may import this module).

A `.safetensors` / `.sft` file starts with an 8-byte little-endian length and a JSON header that
names every tensor with its shape: that is all a family needs to recognise the file (the way
ComfyUI's comfy/model_detection.py reads a state dict's keys). A diffusers / transformers folder
has a `config.json` instead (`_class_name`, `architectures`; a whole pipeline folder its
`model_index.json`). Pickled weights (`.ckpt`, `.pt`,
`.bin`) cannot be read without unpickling them: they are reported as unknown here.
"""

from __future__ import annotations

import json
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_HEADER_BYTES = 100 * 2**20  # safetensors' own limit on its JSON header
SAFETENSORS_SUFFIXES = (".safetensors", ".sft")


class HeaderUnreadable(ValueError):
    """A weight file whose header is not a safetensors header (corrupt, truncated, another
    format)."""


@dataclass(frozen=True)
class ModelHeader:
    """The tensor names and shapes of one model (`shapes`), or its folder's config (`config`).

    `shapes` maps every tensor key to its shape; `config` is a folder's config.json (empty for a
    single file, whose sidecar `<stem>.config.json` is read into `config` when present).
    """

    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)

    def has(self, *fragments: str) -> bool:
        """Whether some key contains every fragment (in any order), e.g. has("double_blocks.")."""
        return any(all(f in key for f in fragments) for key in self.shapes)

    def is_lora(self) -> bool:
        """Low-rank weights (kohya `lora_down` / `lora_up`, PEFT `lora_A` / `lora_B`, diffusers'
        older `lora.down`): a LoRA file, whichever model it is for."""
        return self.has("lora_down.") or self.has("lora_A.") or self.has(".lora.down.")

    def shape(self, suffix: str) -> tuple[int, ...] | None:
        """The shape of the first key that ends with `suffix` (prefixes vary by layout)."""
        return next((s for k, s in self.shapes.items() if k.endswith(suffix)), None)

    def latent_channels(self) -> int | None:
        """An AutoencoderKL's latent channels (its config's, or its decoder's input width)."""
        if "latent_channels" in self.config:
            return int(self.config["latent_channels"])
        conv_in = self.shapes.get("decoder.conv_in.weight")  # no prefix: a VAE, no checkpoint
        return conv_in[1] if conv_in is not None and len(conv_in) == 4 else None

    @property
    def class_name(self) -> str:
        """A folder's diffusers `_class_name` or transformers `architectures[0]` ("" if none)."""
        archs = self.config.get("architectures") or [""]
        return str(self.config.get("_class_name") or archs[0] or "")


_cache: dict[tuple[str, int, int], ModelHeader | None] = {}
_lock = threading.Lock()


def read_header(path: Path) -> ModelHeader | None:
    """The header of the model at `path` (a weight file or a folder with config.json); None for
    pickled weights. Raises HeaderUnreadable for a file that claims to be safetensors and is
    not. Cached by path, size and mtime (the scan reads every file each heartbeat)."""
    path = Path(path)
    target = folder_config(path) if path.is_dir() else path
    st = target.stat()
    key = (str(target.resolve()), st.st_size, st.st_mtime_ns)
    with _lock:
        if key in _cache:
            return _cache[key]
    header = _read(path)
    with _lock:
        _cache[key] = header
    return header


def folder_config(path: Path) -> Path:
    """A model folder's config: its config.json (a component), else the model_index.json of a
    whole diffusers pipeline (LTX-2's folder: `_class_name` LTX2Pipeline)."""
    own = path / "config.json"
    return own if own.is_file() or not (path / "model_index.json").is_file() else path / "model_index.json"


def is_model_folder(path: Path) -> bool:
    """A folder that is one model: a config.json or a pipeline's model_index.json."""
    return (path / "config.json").is_file() or (path / "model_index.json").is_file()


def _read(path: Path) -> ModelHeader | None:
    if path.is_dir():
        config = _json_file(folder_config(path))
        shapes: dict[str, tuple[int, ...]] = {}
        for weights in sorted(path.glob("*.safetensors")):
            shapes.update(_safetensors_shapes(weights))
        return ModelHeader(shapes, config)
    if not path.name.lower().endswith(SAFETENSORS_SUFFIXES):
        return None
    return ModelHeader(_safetensors_shapes(path), {})


def _safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise HeaderUnreadable(f"{path.name} is not a safetensors file (shorter than 8 bytes)")
        (length,) = struct.unpack("<Q", head)
        if length > MAX_HEADER_BYTES:
            raise HeaderUnreadable(f"{path.name} is not a safetensors file (header length {length})")
        raw = f.read(length)
    try:
        entries = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HeaderUnreadable(f"{path.name} is not a safetensors file ({exc})") from None
    if not isinstance(entries, dict):
        raise HeaderUnreadable(f"{path.name} is not a safetensors file (its header is no map)")
    return {k: tuple(v.get("shape", ())) for k, v in entries.items()
            if k != "__metadata__" and isinstance(v, dict)}


def _json_file(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
