"""The models dir: a ComfyUI-style tree of weight files. TORCH-FREE (imported by the web side).

Layout (`<models_dir>/<folder>/<name>`):
    diffusion_models/   denoisers (ComfyUI's legacy `unet/` is read as an alias)
    vae/                autoencoders
    text_encoders/      text encoders (ComfyUI's legacy `clip/` is read as an alias)
    loras/, checkpoints/
    upscale_models/     ESRGAN-family upscalers (workers/models/upscale: role `upscaler`)
    latent_upscale_models/  a family's latent upsamplers (LTX-2's: role `latent_upscaler`)
A model is either a single weight file (.safetensors/.sft/.ckpt/.pt/.pth/.bin) or a folder that holds
a `config.json` (a diffusers/transformers folder) or a `model_index.json` (a whole diffusers
pipeline: LTX-2's). Names are paths relative to the folder with
`/` separators, so `flux/ae.safetensors` is a valid name. Sidecars that are not weight files
(`<stem>.config.json`, `<stem>.tokenizer/`, `<stem>.diffusers/`) are never listed.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path, PurePosixPath

from workers.models import upscale
from workers.models.families import identify, info
from workers.models.family import ModelLoadError
from workers.models.header import HeaderUnreadable, is_model_folder, read_header

FOLDERS: tuple[str, ...] = ("diffusion_models", "vae", "text_encoders", "loras", "checkpoints",
                            "upscale_models", "latent_upscale_models")
ALIASES: dict[str, tuple[str, ...]] = {"diffusion_models": ("unet",), "text_encoders": ("clip",)}
WEIGHT_SUFFIXES: tuple[str, ...] = (".safetensors", ".sft", ".ckpt", ".pt", ".pth", ".bin")
SIDECAR_DIR_SUFFIXES: tuple[str, ...] = (".tokenizer", ".diffusers")

_HASH_CHUNK = 8 * 2**20


class ModelFileMissing(FileNotFoundError):
    """A graph names a model file that this worker's models dir does not hold."""


def scan(models_dir: Path) -> list[dict[str, object]]:
    """Every model in `models_dir`, as `{"folder", "name", "kind": "file"|"dir", "size",
    "family", "role", "families"}`.

    `family` / `role` say what the file is, from its own keys (workers/models/families.py:
    the first registered family that recognises it, and `families`, every one that does); both
    None for a file no family recognises or whose format is unreadable without torch.
    Alias folders (`unet/`, `clip/`) are reported under their canonical folder; a name present
    in both keeps the canonical folder's entry. A missing models dir holds no models.
    """
    entries: list[dict[str, object]] = []
    for folder in FOLDERS:
        seen: set[str] = set()
        for root in _roots(Path(models_dir), folder):
            for name, path in _models_under(root):
                if name not in seen:
                    seen.add(name)
                    entries.append(_entry(folder, name, path))
    return entries


def resolve(models_dir: Path, folder: str, name: str) -> Path:
    """The path of model `name` in `folder`; raises `ModelFileMissing` naming where it belongs."""
    if folder not in FOLDERS:
        raise ValueError(f"unknown models folder {folder!r}; expected one of {FOLDERS}")
    rel = PurePosixPath(name)
    if not name or rel.is_absolute() or ".." in rel.parts:
        raise ModelFileMissing(f"{name!r} is not a model name: use a path inside {folder}/")
    for root in _roots(Path(models_dir), folder):
        path = root.joinpath(*rel.parts)
        if path.is_file() or (path.is_dir() and is_model_folder(path)):
            return path
    where = Path(models_dir) / folder
    raise ModelFileMissing(
        f"model file {name!r} not found: put it in {where}/ (the {folder!r} folder of the "
        f"models dir {Path(models_dir)})"
    )


def file_sha256(path: Path) -> str:
    """sha256 of a weight file, or of a folder model (cached in-process by path, size, mtime).

    A folder's hash is the sha256 of its manifest: one line `<relative path>\\0<size>\\0<sha256>`
    per file (hidden files skipped), sorted by path. It changes when any file's bytes, name or
    presence changes, and each file hash is reused from the cache, so re-hashing is cheap.
    """
    path = Path(path)
    if path.is_dir():
        lines = [
            f"{p.relative_to(path).as_posix()}\0{p.stat().st_size}\0{_file_hash(p)}"
            for p in sorted(_files_under(path))
        ]
        return hashlib.sha256("\n".join(lines).encode()).hexdigest()
    if not path.is_file():
        raise ModelFileMissing(f"cannot hash {path}: no such file")
    return _file_hash(path)


_hash_cache: dict[tuple[str, int, int], str] = {}
_hash_lock = threading.Lock()


def _file_hash(path: Path) -> str:
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    with _hash_lock:
        if key in _hash_cache:
            return _hash_cache[key]
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    with _hash_lock:
        _hash_cache[key] = digest.hexdigest()
    return _hash_cache[key]


def _roots(models_dir: Path, folder: str) -> list[Path]:
    """The canonical folder first, then its aliases (only those that exist)."""
    names = (folder, *ALIASES.get(folder, ()))
    return [models_dir / n for n in names if (models_dir / n).is_dir()]


def _models_under(root: Path) -> list[tuple[str, Path]]:
    """(name, path) of every model below `root`; a folder with config.json (or a
    pipeline's model_index.json) is one model."""
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        keep = []
        for d in sorted(dirnames):
            if d.startswith(".") or d.endswith(SIDECAR_DIR_SUFFIXES):
                continue
            if is_model_folder(here / d):
                found.append(((here / d).relative_to(root).as_posix(), here / d))
            else:
                keep.append(d)
        dirnames[:] = keep  # os.walk descends only into plain sub-folders
        for f in sorted(filenames):
            if not f.startswith(".") and f.lower().endswith(WEIGHT_SUFFIXES):
                found.append(((here / f).relative_to(root).as_posix(), here / f))
    return sorted(found)


def _files_under(path: Path) -> list[Path]:
    return [
        p
        for p in path.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
    ]


def _entry(folder: str, name: str, path: Path) -> dict[str, object]:
    if path.is_dir():
        size = sum(p.stat().st_size for p in _files_under(path))
        entry: dict[str, object] = {"folder": folder, "name": name, "kind": "dir", "size": size}
    else:
        entry = {"folder": folder, "name": name, "kind": "file", "size": path.stat().st_size}
    return {**entry, **_identity(path, folder)}


def _identity(path: Path, folder: str) -> dict[str, object]:
    if folder == "upscale_models":
        return _upscaler_identity(path)
    try:
        found = identify(path, folder)
    except (ModelLoadError, OSError):  # corrupt: listed, and its load will say why
        return {"family": None, "role": None, "families": []}
    return {"family": found.family or None, "role": found.role or None,
            "families": list(found.families), "variant": _variant(path, found.family)}


def _variant(path: Path, family: str) -> str | None:
    """The family's kind of this model (FamilyInfo.variant), None where it has one kind."""
    variant = info(family).variant if family else None
    header = read_header(path) if variant is not None else None
    return variant(header) if variant is not None and header is not None else None


def _upscaler_identity(path: Path) -> dict[str, object]:
    """An upscale model belongs to no family: role `upscaler` when its safetensors header is an
    architecture the farm runs, None when it is not (or a pickle: its load will say)."""
    try:
        header = read_header(path)
        if header is not None and not path.is_dir():
            upscale.recognise(header.shapes)
            return {"family": None, "role": upscale.ROLE, "families": []}
    except (HeaderUnreadable, upscale.NotAnUpscaler, OSError):
        pass
    return {"family": None, "role": None, "families": []}
