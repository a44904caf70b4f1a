"""Takes (immutable outputs) and assets (uploads); both point at content-addressed blobs."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q


class Take(models.Model):
    """One immutable output of a run's node. Postgres refuses any UPDATE of this table."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # PROTECT, not CASCADE: a take is removed only by retention (`take_remove`, audited), never as
    # a side effect of deleting its run or its owner. Deleting a run that has takes is refused
    # (the admin shows which takes stand in the way); SET_NULL is no option either, as Postgres
    # refuses every UPDATE of a take — and the run is the take's provenance.
    run = models.ForeignKey("runs.Run", on_delete=models.PROTECT, related_name="takes")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                              related_name="takes")
    node_id = models.CharField(max_length=200)
    index = models.PositiveIntegerField(default=0, help_text="Nth take of this node in this run.")
    sha256 = models.CharField(max_length=64)
    media_type = models.CharField(max_length=64)
    size = models.PositiveBigIntegerField()
    width = models.PositiveIntegerField(null=True, blank=True)
    height = models.PositiveIntegerField(null=True, blank=True)
    seed = models.BigIntegerField(null=True, blank=True)
    # a clip's (video/*, animated WebP): null for a still image
    frame_count = models.PositiveIntegerField(null=True, blank=True)
    fps = models.FloatField(null=True, blank=True)
    duration_seconds = models.FloatField(null=True, blank=True)
    audio_seconds = models.FloatField(null=True, blank=True, help_text="null: no sound track")
    lineage = models.JSONField(default=dict, help_text="graph hash, model file hashes, params…")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "node_id", "index"]
        indexes = [models.Index(fields=["owner", "-created_at"])]
        constraints = [
            models.UniqueConstraint(fields=["run", "node_id", "index"], name="take_once_per_slot"),
            models.CheckConstraint(condition=Q(sha256__regex=r"^[0-9a-f]{64}$"),
                                   name="take_sha256_hex"),
        ]

    def __str__(self) -> str:
        return f"take {self.id} ({self.node_id})"

    @property
    def is_clip(self) -> bool:
        """A video or an animated WebP: it has frames."""
        return self.frame_count is not None


class Asset(models.Model):
    """A content-addressed upload (input image, mask), owned by its uploader."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                              related_name="assets")
    sha256 = models.CharField(max_length=64)
    media_type = models.CharField(max_length=64)
    size = models.PositiveBigIntegerField()
    width = models.PositiveIntegerField(null=True, blank=True)
    height = models.PositiveIntegerField(null=True, blank=True)
    original_name = models.CharField(max_length=255, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["owner", "sha256"], name="asset_once_per_owner"),
            models.CheckConstraint(condition=Q(sha256__regex=r"^[0-9a-f]{64}$"),
                                   name="asset_sha256_hex"),
        ]

    def __str__(self) -> str:
        return f"asset {self.id} ({self.media_type})"


class TakeRemoval(models.Model):
    """The audit record of one take removed by retention: who removed it, why, when, what it was.

    Append-only: Postgres refuses UPDATE and DELETE of these rows.
    """

    take_id = models.UUIDField(unique=True)
    run_id = models.UUIDField()
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                              related_name="+")
    node_id = models.CharField(max_length=200)
    sha256 = models.CharField(max_length=64)
    media_type = models.CharField(max_length=64)
    size = models.PositiveBigIntegerField()
    lineage = models.JSONField(default=dict)
    take_created_at = models.DateTimeField()
    removed_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                                   related_name="take_removals")
    reason = models.TextField()
    removed_at = models.DateTimeField(auto_now_add=True)
    blob_released = models.BooleanField(
        help_text="No take or asset referenced the bytes any more: they were deleted."
    )

    class Meta:
        ordering = ["-removed_at"]
        constraints = [
            models.CheckConstraint(condition=~Q(reason=""), name="takeremoval_has_reason"),
            models.CheckConstraint(condition=Q(sha256__regex=r"^[0-9a-f]{64}$"),
                                   name="takeremoval_sha256_hex"),
        ]

    def __str__(self) -> str:
        return f"removal of take {self.take_id}"
