"""A user's ComfyUI user directory, kept in PostgreSQL: the editor's saved workflows (`/userdata`)
and its settings (`/settings`, stored as ComfyUI stores them: `comfy.settings.json`).

Every function takes the user whose directory it reads or writes; nobody reaches another user's
files (a path is only ever looked up under its owner).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.conf import settings as farm_settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import Count, Sum
from django.utils import timezone

from apps.graphs.schema import text_problem
from apps.importer.models import ComfyUserFile
from apps.runs.services.submit import advisory_lock

SETTINGS_FILE = "comfy.settings.json"
MAX_PATH = 500
LOCK_COMFY_USERDATA = 5  # advisory-lock namespace (comfy_door.py holds 4): per owner


class UserPathInvalid(ValueError):
    """A user-data path the farm does not store: empty, absolute, `..`, or unstorable text."""


class UserFileExists(Exception):
    """The destination holds a file and the caller did not ask to overwrite it."""


class UserQuotaExceeded(Exception):
    """The write would take the user's directory past its quota (INLINE_COMFY_USERDATA_MAX_BYTES
    / _MAX_FILES); nothing was written."""


def _quota_check(*, user: User, path: str, size: int, replaces: int | None) -> None:
    """Refuse a write of `size` bytes at `path` (replacing a file of `replaces` bytes, or a new
    file when None) that would take the user past a limit. A write that grows nothing (a file
    rewritten no larger) always passes, so a user over a lowered limit can still shrink.
    Call holding the user's lock (`_lock`)."""
    held = ComfyUserFile.objects.filter(owner=user).aggregate(n=Count("id"), b=Sum("size"))
    files, used = held["n"] or 0, held["b"] or 0
    max_bytes = farm_settings.INLINE_COMFY_USERDATA_MAX_BYTES
    max_files = farm_settings.INLINE_COMFY_USERDATA_MAX_FILES
    after = used - (replaces or 0) + size
    if after > max_bytes and size > (replaces or 0):
        raise UserQuotaExceeded(
            f"saving {path!r} ({size} bytes) would take your ComfyUI files to {after} bytes; "
            f"the limit is {max_bytes} bytes (you use {used}): delete some workflows first")
    if replaces is None and files + 1 > max_files:
        raise UserQuotaExceeded(
            f"saving {path!r} would make {files + 1} ComfyUI files; the limit is {max_files} "
            "files: delete some workflows first")


def _lock(user: User) -> None:
    """The user's directory, one writer at a time (inside `transaction.atomic()`): a quota
    checked is a quota kept."""
    advisory_lock(LOCK_COMFY_USERDATA, user.pk)


@dataclass(frozen=True)
class UserFileInfo:
    """What ComfyUI's `full_info` listing says of a file."""

    path: str
    size: int
    modified: float

    def as_json(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "modified": self.modified}


def user_path(raw: str) -> str:
    """`raw` as a stored path ('/'-separated, relative), or UserPathInvalid."""
    if text_problem(raw) is not None:
        raise UserPathInvalid("the path holds text that cannot be stored")
    parts = raw.replace("\\", "/").split("/")
    if raw.startswith("/") or any(p in ("..", ".") for p in parts):
        raise UserPathInvalid(f"{raw!r} is not a relative path inside the user directory")
    path = "/".join(p for p in parts if p)
    if not path or len(path) > MAX_PATH:
        raise UserPathInvalid("the path is empty or longer than 500 characters")
    return path


def _info(row: ComfyUserFile, base: str) -> UserFileInfo:
    return UserFileInfo(path=row.path[len(base):], size=row.size,
                        modified=row.modified_at.timestamp())


def comfy_userfile_list(*, user: User, directory: str, recurse: bool) -> list[UserFileInfo] | None:
    """The files under `directory` (paths relative to it), or None when it holds none (ComfyUI
    answers a directory that does not exist with 404)."""
    base = user_path(directory) + "/"
    rows = (ComfyUserFile.objects.filter(owner=user, path__startswith=base)
            .only("path", "size", "modified_at").order_by("path"))
    found = [_info(row, base) for row in rows]
    if not recurse:
        found = [f for f in found if "/" not in f.path]
    return found or None


def comfy_userfile_get(*, user: User, path: str) -> bytes | None:
    row = ComfyUserFile.objects.filter(owner=user, path=user_path(path)).first()
    return bytes(row.content) if row is not None else None


@transaction.atomic
def comfy_userfile_put(*, user: User, path: str, content: bytes, overwrite: bool) -> UserFileInfo:
    """Write a file; UserFileExists when it exists and `overwrite` is off."""
    path = user_path(path)
    now = timezone.now()
    _lock(user)
    row = ComfyUserFile.objects.select_for_update().filter(owner=user, path=path).first()
    if row is not None and not overwrite:
        raise UserFileExists(path)
    _quota_check(user=user, path=path, size=len(content),
                 replaces=row.size if row is not None else None)
    if row is None:
        try:
            with transaction.atomic():
                row = ComfyUserFile.objects.create(owner=user, path=path, content=content,
                                                   size=len(content), modified_at=now)
        except IntegrityError:  # written meanwhile by another request of the same user
            raise UserFileExists(path) from None
    else:
        row.content, row.size, row.modified_at = content, len(content), now
        row.save(update_fields=["content", "size", "modified_at"])
    return _info(row, "")


@transaction.atomic
def comfy_userfile_move(*, user: User, source: str, dest: str, overwrite: bool) -> UserFileInfo | None:
    """Rename a file (None when `source` does not exist); UserFileExists as for a write."""
    source, dest = user_path(source), user_path(dest)
    _lock(user)
    row = ComfyUserFile.objects.select_for_update().filter(owner=user, path=source).first()
    if row is None:
        return None
    if source == dest:
        return _info(row, "")
    held = ComfyUserFile.objects.select_for_update().filter(owner=user, path=dest)
    if held.exists():
        if not overwrite:
            raise UserFileExists(dest)
        held.delete()
    row.path, row.modified_at = dest, timezone.now()
    row.save(update_fields=["path", "modified_at"])
    return _info(row, "")


def comfy_userfile_delete(*, user: User, path: str) -> bool:
    return ComfyUserFile.objects.filter(owner=user, path=user_path(path)).delete()[0] > 0


# --- settings (one JSON file, as ComfyUI keeps them) -----------------------------------------

def comfy_settings_get(*, user: User) -> dict[str, Any]:
    raw = comfy_userfile_get(user=user, path=SETTINGS_FILE)
    try:
        settings = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return settings if isinstance(settings, dict) else {}


@transaction.atomic
def comfy_settings_update(*, user: User, values: dict[str, Any]) -> None:
    """Merge `values` into the user's settings (one writer at a time per user)."""
    _lock(user)
    settings = {**comfy_settings_get(user=user), **values}
    comfy_userfile_put(user=user, path=SETTINGS_FILE, overwrite=True,
                       content=json.dumps(settings, indent=4).encode())
