"""Content-addressed blob storage under INLINE_DATA_DIR/blobs: bytes are named by their sha256."""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from pathlib import Path

from django.conf import settings
from django.db import connection

# First key of the two-int advisory locks on blobs (a key space of its own in Postgres).
BLOB_LOCK_SPACE = 0x0B10B


class BlobMissing(Exception):
    """A blob named by the database is not on disk (storage was moved or pruned)."""


def blob_path(sha256: str) -> Path:
    return Path(settings.INLINE_BLOB_DIR) / sha256[:2] / sha256


def blob_put(data: bytes, digest: str | None = None) -> str:
    """Store `data` (idempotent: same bytes, same name, written once); return its sha256
    (`digest`, when the caller has it already)."""
    digest = digest or hashlib.sha256(data).hexdigest()
    staged = blob_stage(data, digest)
    if staged is not None:
        os.replace(staged, blob_path(digest))
    return digest


def blob_put_file(staged: Path, digest: str) -> str:
    """Store the file `staged` (from `blob_stage_file`, flushed) as blob `digest` by renaming it;
    when the blob is stored already, the file is deleted."""
    path = blob_path(digest)
    if path.exists():
        staged.unlink(missing_ok=True)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staged, path)
    return digest


def blob_stage_file(suffix: str = "") -> Path:
    """A new empty file in the blob store's staging folder (same filesystem, so `blob_put_file`
    names it by a rename) for a writer that streams a blob's bytes (a video encoder)."""
    staging = Path(settings.INLINE_BLOB_DIR) / ".staging"
    staging.mkdir(parents=True, exist_ok=True)
    _staging_sweep(staging)
    fd, tmp = tempfile.mkstemp(dir=staging, prefix=".tmp-", suffix=suffix)
    os.close(fd)
    return Path(tmp)


STAGED_MAX_AGE = 24 * 3600  # seconds: a staged file this old belongs to an attempt that died


def _staging_sweep(staging: Path) -> None:
    """Delete staged files left by attempts that never stored them (a worker killed between
    encoding and its flush, a run cancelled meanwhile): nothing names a staged file but the
    draft of the process that made it, and no draft lives a day."""
    cutoff = time.time() - STAGED_MAX_AGE
    for entry in staging.iterdir():
        try:
            if entry.stat().st_mtime < cutoff:
                entry.unlink()
        except FileNotFoundError:
            pass  # another worker swept it first


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, read in chunks (bounded memory)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def blob_stage(data: bytes, digest: str) -> Path | None:
    """Write `data`, blob `digest`'s bytes, to a temporary file beside its place and flush it to
    disk, but do not name it yet (nothing reads or deletes it there); None when the blob is
    stored already; the caller names it (`os.replace`)."""
    path = blob_path(digest)
    if path.exists():
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written to a temp file, then renamed: a reader never sees a half-written blob.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        os.unlink(tmp)
        raise
    return Path(tmp)


def blob_read(sha256: str) -> bytes:
    try:
        return blob_path(sha256).read_bytes()
    except FileNotFoundError:
        raise BlobMissing(f"blob {sha256} is missing from {settings.INLINE_BLOB_DIR}") from None


def blob_lock(sha256: str, *, shared: bool) -> None:
    """Hold blob `sha256`'s advisory lock until the current transaction ends.

    Writers of a reference (a take, an asset) hold it shared from `blob_put` to commit; retention
    holds it exclusive from its reference check to the unlink. So bytes are never deleted under
    a reference that is being written. Call inside `transaction.atomic()`.
    """
    fn = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {fn}(%s, %s)", [BLOB_LOCK_SPACE, blob_lock_key(sha256)])


def blob_lock_key(sha256: str) -> int:
    """The second key of blob `sha256`'s advisory lock (a signed int4)."""
    return int(sha256[:8], 16) - 2**31


def blob_delete(sha256: str) -> bool:
    """Delete blob `sha256` from disk; False when it was not there."""
    try:
        blob_path(sha256).unlink()
    except FileNotFoundError:
        return False
    return True
