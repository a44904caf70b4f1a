"""The ComfyUI front door's own records: client keys, queued prompts, what each user hid from
their editor's history, uploaded input names, the editor's user files."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q


class ComfyKey(models.Model):
    """A per-user key carried in a base URL (`/comfy/k/<key>/`) for ComfyUI clients that cannot
    send an `Authorization` header; only its sha256 is stored, the secret is shown once."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="comfy_keys")
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=12, help_text="The first characters, to recognise it.")
    key_sha256 = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "ComfyUI client key"
        indexes = [models.Index(fields=["user", "created_at"])]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"


class ComfyPrompt(models.Model):
    """One `POST /prompt`: the workflow as the client sent it and the run it became.

    Several prompts may share a run (an identical workflow still in flight is coalesced);
    `number` is ComfyUI's queue counter, counted per owner; `id` its `prompt_id`. `prompt` keeps
    the nodes that run (API format), not what the client sent around them.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    number = models.BigIntegerField()
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                              related_name="comfy_prompts")
    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="comfy_prompts")
    client_id = models.CharField(max_length=200, blank=True)
    prompt = models.JSONField(help_text="The API-format nodes that run, as the client sent them.")
    extra_data = models.JSONField(default=dict, blank=True)
    outputs = models.JSONField(default=list, help_text="The output node ids it executes.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            models.Index(fields=["owner", "client_id", "number"]),
        ]
        constraints = [
            models.UniqueConstraint(fields=["owner", "number"], name="comfy_prompt_number_per_owner"),
        ]

    def __str__(self) -> str:
        return f"prompt {self.number} ({self.id})"


class ComfyHistoryHidden(models.Model):
    """A finished prompt one user removed from their editor's history (`POST /history`
    `{delete: [ids]}`): gone from that user's /history and /api/jobs, nothing else. The prompt,
    its run and takes stay as they were (runs and takes are the farm's record)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="+")
    prompt = models.ForeignKey(ComfyPrompt, on_delete=models.CASCADE, related_name="hidden_by")
    hidden_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "ComfyUI history entry hidden"
        constraints = [
            models.UniqueConstraint(fields=["user", "prompt"], name="comfy_history_hidden_once"),
        ]

    def __str__(self) -> str:
        return f"prompt {self.prompt_id} hidden by user {self.user_id}"


class ComfyHistoryCleared(models.Model):
    """When one user last cleared their editor's history (`POST /history {clear: true}`): the
    prompts queued and finished by then are hidden from that user's /history and /api/jobs; one
    still running then shows up once it finishes, as in ComfyUI."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                                primary_key=True, related_name="+")
    cleared_at = models.DateTimeField()

    class Meta:
        verbose_name = "ComfyUI history cleared"

    def __str__(self) -> str:
        return f"user {self.user_id} cleared at {self.cleared_at:%Y-%m-%d %H:%M:%S}"


class ComfyUpload(models.Model):
    """A name a user gave an image through `POST /upload/image`; LoadImage resolves the newest
    row of that (subfolder, name) to its asset."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                              related_name="comfy_uploads")
    subfolder = models.CharField(max_length=200, blank=True)
    name = models.CharField(max_length=255)
    asset = models.ForeignKey("takes.Asset", on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["owner", "subfolder", "name", "-created_at"])]
        constraints = [
            models.CheckConstraint(condition=~Q(name=""), name="comfy_upload_named"),
        ]

    def __str__(self) -> str:
        return f"{self.subfolder}/{self.name}" if self.subfolder else self.name


class ComfyUserFile(models.Model):
    """One file of a user's ComfyUI user directory (the editor's `/userdata`: saved workflows,
    `comfy.settings.json`, …), kept in PostgreSQL so that it follows the user to any web host."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                              related_name="comfy_user_files")
    path = models.CharField(max_length=500, help_text="Relative, '/'-separated, never '..'.")
    content = models.BinaryField()
    size = models.BigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)
    modified_at = models.DateTimeField()

    class Meta:
        verbose_name = "ComfyUI user file"
        constraints = [
            models.UniqueConstraint(fields=["owner", "path"], name="comfy_user_file_path_per_owner"),
            models.CheckConstraint(condition=~Q(path=""), name="comfy_user_file_named"),
        ]

    def __str__(self) -> str:
        return self.path
