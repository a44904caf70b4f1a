"""The registry of model families: the one place a family is named outside its package.
TORCH-FREE until `plugin(id)` imports a family's torch half.

Registering a family is adding its id to `REGISTERED` (order matters: a file recognised by
several families is reported under the first). `identify(path)` answers which families
recognise a model file and as what role (workers/models/family.py has the contract).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from workers.models.family import FOLDER_ROLES, FamilyInfo, FamilyPlugin, ModelLoadError
from workers.models.header import HeaderUnreadable, ModelHeader, read_header

REGISTERED: tuple[str, ...] = ("flux1", "zimage", "sdxl", "qwenimage", "flux2", "wan", "krea2",
                              "qwenimage21", "ltx2", "minimaxh3")


def info(family_id: str) -> FamilyInfo:
    """A registered family's torch-free facts (its package's FAMILY)."""
    _check(family_id)
    return cast(FamilyInfo, importlib.import_module(f"workers.models.{family_id}").FAMILY)


def plugin(family_id: str) -> FamilyPlugin:
    """A registered family's torch half (workers/models/<id>/plugin.py)."""
    _check(family_id)
    return cast(FamilyPlugin, importlib.import_module(f"workers.models.{family_id}.plugin"))


def import_node_runners() -> None:
    """Import every registered family's node modules (registering their runners)."""
    for family_id in REGISTERED:
        for module in info(family_id).nodes:
            importlib.import_module(f"workers.models.{family_id}.{module}")


@dataclass(frozen=True)
class Identity:
    """What a model file is: its `role` and the registered `families` that recognise it (first:
    the one that loads it). Both empty when no family does, or when the file is `pickled`
    (.ckpt/.pt/.bin: unreadable without torch)."""

    role: str = ""
    families: tuple[str, ...] = ()
    pickled: bool = False

    @property
    def family(self) -> str:
        return self.families[0] if self.families else ""


def recognise(header: ModelHeader, folder: str | None = None) -> Identity:
    """The role and families of a model with `header` (only roles that live in `folder`)."""
    allowed = FOLDER_ROLES.get(folder or "", ())
    found: list[tuple[str, str]] = []
    for family_id in REGISTERED:
        role = info(family_id).recognise(header)
        if role is not None and (not allowed or role in allowed):
            found.append((family_id, role))
    if not found:
        return Identity()
    role = found[0][1]
    return Identity(role, tuple(f for f, r in found if r == role))


def identify(path: Path, folder: str | None = None) -> Identity:
    """The identity of the model at `path`. Raises ModelLoadError for a corrupt safetensors
    file."""
    try:
        header = read_header(path)
    except HeaderUnreadable as exc:
        raise ModelLoadError(str(exc)) from None
    return Identity(pickled=True) if header is None else recognise(header, folder)


def loader_family(paths: Path | list[Path], folder: str,
                  among: tuple[str, ...] | None = None) -> str:
    """The family whose plug-in loads `paths` (one model; a family's text encoders may be two
    files) from `folder`: the first registered family (of `among`, when given: a loader that
    names its family) that recognises every file (pickled files constrain nothing: its loader
    says whether they are its own). Raises ModelLoadError naming the files and their folder
    when no family recognises them all."""
    paths = [paths] if isinstance(paths, Path) else paths
    for family_id in among or ():
        _check(family_id)
    common = [f for f in REGISTERED if among is None or f in among]
    for path in paths:
        try:
            identity = identify(path, folder)
        except ModelLoadError as exc:
            raise ModelLoadError(f"cannot load {path.name} from {folder}/: {exc}") from None
        if not identity.pickled:
            common = [f for f in common if f in identity.families]
    if not common:
        names = " + ".join(p.name for p in paths)
        raise ModelLoadError(
            f"cannot load {names} from {folder}/: no registered model family "
            f"({', '.join(among or REGISTERED)}) recognises {'its' if len(paths) == 1 else 'all their'} "
            "weights; is it in the right folder?"
        )
    return common[0]


def _check(family_id: str) -> None:
    if family_id not in REGISTERED:
        raise ValueError(f"unknown model family {family_id!r}; registered: {REGISTERED}")
