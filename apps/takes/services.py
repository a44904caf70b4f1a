"""Writes on takes and assets. Takes are only ever created, never updated."""

from __future__ import annotations

import hashlib
import io
import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, connection, transaction
from django.utils import timezone
from PIL import Image, UnidentifiedImageError

from apps.takes.media import clip_inspect, looks_like_audio, looks_like_video, sound_inspect
from apps.takes.models import Asset, Take, TakeRemoval
from apps.takes.storage import blob_delete, blob_lock, blob_put, blob_put_file

ACCEPTED_UPLOADS = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp"}


class UploadRejected(Exception):
    """An upload is not something the farm keeps; `code` and `status` shape the HTTP answer."""

    def __init__(self, code: str, message: str, status: int) -> None:
        super().__init__(message)
        self.code, self.message, self.status = code, message, status


class RemovalRefused(Exception):
    """A retention request the farm will not carry out (no reason given)."""


@dataclass(frozen=True)
class ImageInfo:
    media_type: str
    width: int | None  # None: a sound file
    height: int | None


def take_create(
    *,
    run_id: Any,
    owner_id: int,
    node_id: str,
    index: int,
    data: bytes,
    media_type: str,
    width: int | None,
    height: int | None,
    seed: int | None,
    lineage: dict[str, Any],
) -> Take:
    """Keep `data` as the take of (run, node, index); a repeat returns the take already kept.

    Exactly-once per slot: a retried run (after a lost worker) finds its earlier take here.
    """
    digest = hashlib.sha256(data).hexdigest()
    try:
        with transaction.atomic():
            blob_lock(digest, shared=True)  # retention cannot delete the bytes until we commit
            blob_put(data)
            return Take.objects.create(
                run_id=run_id, owner_id=owner_id, node_id=node_id, index=index, sha256=digest,
                media_type=media_type, size=len(data), width=width, height=height, seed=seed,
                lineage=lineage,
            )
    except IntegrityError:
        return Take.objects.get(run_id=run_id, node_id=node_id, index=index)


def take_remove(*, take_ids: Iterable[Any], by: User, reason: str) -> list[TakeRemoval]:
    """Retention: delete takes, each with an audit record of who, why and what it was.

    The only way a take goes. Its bytes go too once no take or asset references their sha256:
    checked again after commit under the blob's exclusive lock, so a `take_create` of the same
    bytes racing with us either commits first (the bytes stay) or writes them again.
    Ids that name no take are ignored (already removed).
    """
    reason = reason.strip()
    if not reason:
        raise RemovalRefused("say why these takes are removed")
    with transaction.atomic():
        takes = list(Take.objects.select_for_update().filter(pk__in=list(take_ids)))
        Take.objects.filter(pk__in=[t.pk for t in takes]).delete()
        released = {t.sha256 for t in takes if not _blob_referenced(t.sha256)}
        removals = TakeRemoval.objects.bulk_create(
            _removal_of(take, by=by, reason=reason, released=take.sha256 in released)
            for take in takes
        )
        for digest in sorted(released):
            transaction.on_commit(partial(_blob_release, digest))
    return removals


def _removal_of(take: Take, *, by: User, reason: str, released: bool) -> TakeRemoval:
    return TakeRemoval(
        take_id=take.pk, run_id=take.run_id, owner_id=take.owner_id, node_id=take.node_id,
        sha256=take.sha256, media_type=take.media_type, size=take.size, lineage=take.lineage,
        take_created_at=take.created_at, removed_by=by, reason=reason, blob_released=released,
    )


def _blob_referenced(sha256: str) -> bool:
    return (Take.objects.filter(sha256=sha256).exists()
            or Asset.objects.filter(sha256=sha256).exists())


def _blob_release(sha256: str) -> None:
    """Delete the bytes of `sha256` if still nothing references them (after the removal commit)."""
    with transaction.atomic():
        blob_lock(sha256, shared=False)
        if not _blob_referenced(sha256):
            blob_delete(sha256)


@dataclass(frozen=True)
class TakeDraft:
    """A take the worker made and has not written yet: it keeps drafts and writes them with its
    next event flush, bytes and row in the same transaction (`takes_keep`)."""

    node_id: str
    index: int
    data: bytes
    media_type: str
    width: int | None
    height: int | None
    seed: int | None
    lineage: dict[str, Any]
    # a clip's: its bytes are in `file` (a staged blob file, `blob_stage_file`) and `data` is
    # empty, so an encoded video is never held in memory
    file: Path | None = None
    clip: ClipFacts | None = None

    @property
    def sha256(self) -> str:
        return self.clip.sha256 if self.clip is not None else hashlib.sha256(self.data).hexdigest()

    @property
    def size(self) -> int:
        return self.clip.size if self.clip is not None else len(self.data)


@dataclass(frozen=True)
class ClipFacts:
    """What a video take's row says about its clip, and its staged file's digest and size."""

    sha256: str
    size: int
    frame_count: int
    fps: float
    duration_seconds: float
    audio_seconds: float | None


def takes_keep(
    *, run_id: Any, owner_id: int, drafts: Sequence[TakeDraft]
) -> dict[tuple[str, int], Take]:
    """Store the drafts' bytes and insert their rows; a slot (node, index) that an earlier attempt
    of the run already filled keeps that take (exactly once per slot). Returns the kept take of
    every draft's slot. Call inside `transaction.atomic()` (the blob locks last until commit)."""
    takes_insert(run_id=run_id, owner_id=owner_id, drafts=drafts)
    wanted = {(d.node_id, d.index) for d in drafts}
    kept = Take.objects.filter(run_id=run_id, node_id__in={n for n, _ in wanted})
    return {(t.node_id, t.index): t for t in kept if (t.node_id, t.index) in wanted}


_TAKES_INSERT = """
INSERT INTO takes_take (id, run_id, owner_id, node_id, index, sha256, media_type, size, width,
                        height, seed, frame_count, fps, duration_seconds, audio_seconds, lineage,
                        created_at)
SELECT t.id, %(run)s, %(owner)s, t.node_id, t.index, t.sha256, t.media_type, t.size, t.width,
       t.height, t.seed, t.frame_count, t.fps, t.duration_seconds, t.audio_seconds, t.lineage,
       t.created_at
FROM unnest(%(ids)s::uuid[], %(nodes)s::text[], %(indexes)s::int[], %(shas)s::text[],
            %(types)s::text[], %(sizes)s::bigint[], %(widths)s::int[], %(heights)s::int[],
            %(seeds)s::bigint[], %(frame_counts)s::int[], %(fpss)s::float8[],
            %(durations)s::float8[], %(audios)s::float8[], %(lineages)s::jsonb[],
            %(created)s::timestamptz[])
     AS t(id, node_id, index, sha256, media_type, size, width, height, seed, frame_count, fps,
          duration_seconds, audio_seconds, lineage, created_at)
ON CONFLICT DO NOTHING
RETURNING id
"""


def takes_insert(*, run_id: Any, owner_id: int, drafts: Sequence[TakeDraft],
                 fresh: bool = False) -> list[Take]:
    """`takes_keep` without reading the kept takes back; returns the takes it inserted.

    A slot an earlier attempt already filled keeps its take, and the draft's bytes are not
    written at all (a retry may render other bytes: they would be kept by nothing). `fresh`:
    the caller knows the run has no take yet (read under its row lock), so none is looked up.
    The rows go in one statement."""
    filled: set[tuple[str, int]] = set() if fresh else set(
        Take.objects.filter(run_id=run_id, node_id__in={d.node_id for d in drafts})
        .values_list("node_id", "index"))
    rows = []
    now = timezone.now()
    for d in drafts:
        if (d.node_id, d.index) in filled:
            if d.file is not None:
                d.file.unlink(missing_ok=True)
            continue
        digest = d.sha256
        blob_lock(digest, shared=True)  # retention cannot delete the bytes until we commit
        if d.file is not None:
            blob_put_file(d.file, digest)
        else:
            blob_put(d.data)
        clip = d.clip
        rows.append(Take(id=uuid.uuid4(), run_id=run_id, owner_id=owner_id, node_id=d.node_id,
                         index=d.index, sha256=digest, media_type=d.media_type,
                         size=d.size, width=d.width, height=d.height, seed=d.seed,
                         frame_count=clip.frame_count if clip else None,
                         fps=clip.fps if clip else None,
                         duration_seconds=clip.duration_seconds if clip else None,
                         audio_seconds=clip.audio_seconds if clip else None,
                         lineage=d.lineage, created_at=now))
    if rows:
        with connection.cursor() as cursor:
            cursor.execute(_TAKES_INSERT, {
                "run": run_id, "owner": owner_id, "ids": [t.id for t in rows],
                "nodes": [t.node_id for t in rows], "indexes": [t.index for t in rows],
                "shas": [t.sha256 for t in rows], "types": [t.media_type for t in rows],
                "sizes": [t.size for t in rows], "widths": [t.width for t in rows],
                "heights": [t.height for t in rows], "seeds": [t.seed for t in rows],
                "frame_counts": [t.frame_count for t in rows], "fpss": [t.fps for t in rows],
                "durations": [t.duration_seconds for t in rows],
                "audios": [t.audio_seconds for t in rows],
                "lineages": [json.dumps(t.lineage) for t in rows],
                "created": [t.created_at for t in rows]})
            inserted = {row[0] for row in cursor.fetchall()}  # not a slot filled meanwhile
        rows = [t for t in rows if t.id in inserted]
        for take in rows:  # as the ORM leaves saved rows of this database
            take._state.adding, take._state.db = False, connection.alias
    return rows


def asset_create(*, owner: User, data: bytes, filename: str = "") -> tuple[Asset, bool]:
    """Keep an uploaded image, video or sound file (content-addressed per owner); returns
    (asset, created)."""
    if len(data) > settings.INLINE_ASSET_MAX_BYTES:
        raise UploadRejected(
            "too_large", f"upload is {len(data)} bytes; the limit is "
            f"{settings.INLINE_ASSET_MAX_BYTES}", 413,
        )
    if not data:
        raise UploadRejected("empty_upload", "the uploaded file is empty", 400)
    info = upload_inspect(data)
    digest = hashlib.sha256(data).hexdigest()
    try:
        with transaction.atomic():
            blob_lock(digest, shared=True)  # retention cannot delete the bytes until we commit
            blob_put(data)
            asset = Asset.objects.create(
                owner=owner, sha256=digest, media_type=info.media_type, size=len(data),
                width=info.width, height=info.height, original_name=filename[:255],
            )
            return asset, True
    except IntegrityError:
        return Asset.objects.get(owner=owner, sha256=digest), False


def upload_inspect(data: bytes) -> ImageInfo:
    """What an upload is: an image (`image_inspect`), an MP4 / WebM clip or a sound file (MP3,
    WAV, FLAC, Ogg / Opus, M4A); 415 for anything else."""
    if not (looks_like_video(data) or looks_like_audio(data)):
        return image_inspect(data)
    clip = clip_inspect(data) if looks_like_video(data) else None
    if clip is not None:
        return ImageInfo(clip.media_type, clip.width, clip.height)
    sound = sound_inspect(data)
    if sound is None:
        raise UploadRejected(
            "unsupported_media_type", "the upload is not a readable MP4 or WebM video, nor an "
            "MP3, WAV, FLAC, Ogg or M4A sound file", 415
        )
    return ImageInfo(sound, None, None)


def image_inspect(data: bytes) -> ImageInfo:
    """The media type and size of an image upload; `UploadRejected` (415) for anything else."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            fmt = image.format or ""
            width, height = image.size
            if width * height > settings.INLINE_MAX_IMAGE_PIXELS:
                raise UploadRejected(
                    "too_large", f"image is {width}x{height}; at most "
                    f"{settings.INLINE_MAX_IMAGE_PIXELS} pixels are accepted", 413,
                )
            image.verify()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError):
        raise UploadRejected(
            "unsupported_media_type", "the upload is not a readable PNG, JPEG or WebP image "
            "(nor an MP4 or WebM video, nor a sound file)", 415
        ) from None
    if fmt not in ACCEPTED_UPLOADS:
        raise UploadRejected(
            "unsupported_media_type", f"{fmt or 'this'} images are not accepted; "
            "upload PNG, JPEG or WebP", 415,
        )
    return ImageInfo(ACCEPTED_UPLOADS[fmt], width, height)
