"""Content-addressed blob storage under INLINE_DATA_DIR/blobs: bytes are named by their sha256."""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
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


def blob_stage(data: bytes, digest: str) -> Path | None:
    """Write `data`, blob `digest`'s bytes, to a temporary file beside its place and flush it to
    disk, but do not name it yet (nothing reads or deletes it there); None when the blob is
    stored already. Then `blob_place` (under the blob's lock) or `blob_unstage`."""
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


def blob_stage_soon(blobs: Sequence[tuple[bytes, str]]) -> Future[list[Path | None]]:
    """`blob_stage` each (data, digest) of `blobs`, on a thread of this process's own, from now:
    the caller goes on (a finish sends its statement) while the bytes reach the disk. On a
    failure what it staged is dropped and the future raises."""

    def stage() -> list[Path | None]:
        staged: list[Path | None] = []
        try:
            for data, digest in blobs:
                staged.append(blob_stage(data, digest))
        except BaseException:
            blob_unstage(staged)
            raise
        return staged

    with _stager_lock:
        if not _stager:
            # one per slot of a default worker (./farm up --slots 4), so a slot's finish does
            # not wait behind another's fsync; threads start only as needed
            _stager.append(ThreadPoolExecutor(STAGE_THREADS, thread_name_prefix="blob-stage"))
        return _stager[0].submit(stage)


STAGE_THREADS = 4
_stager: list[ThreadPoolExecutor] = []
_stager_lock = threading.Lock()


def blob_place(staged: Path | None, data: bytes, digest: str) -> None:
    """Name the bytes `blob_stage` wrote for blob `digest`; call holding the blob's lock (shared,
    as `blob_put`). Staged as already stored (None), the blob may have gone since (retention
    deletes bytes under the exclusive lock): then it is written now."""
    if staged is not None:
        os.replace(staged, blob_path(digest))
    else:
        blob_put(data, digest)


def blob_unstage(staged: Sequence[Path | None] | Future[list[Path | None]]) -> None:
    """Drop staged bytes that were not placed (their writer lost its run, or failed); of a
    `blob_stage_soon`, once it is done (a staging that failed dropped its own)."""
    if isinstance(staged, Future):
        if staged.exception() is not None:  # waits for it
            return
        staged = staged.result()
    for tmp in staged:
        if tmp is not None:
            tmp.unlink(missing_ok=True)


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
