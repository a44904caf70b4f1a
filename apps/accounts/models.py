"""Accounts: teams, hashed API tokens, per-user limits (users are Django's own)."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Team(models.Model):
    """A group of users who can see each other's runs, takes and assets."""

    name = models.CharField(max_length=100, unique=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="teams", blank=True)
    weight = models.PositiveIntegerField(
        default=1, help_text="Fair share: a team with weight 3 gets about 3× the free slots of "
        "a team with weight 1 while both wait.",
    )
    max_inflight_runs = models.PositiveIntegerField(
        null=True, blank=True, help_text="Queued + running runs of all members at once (empty: "
        "no team limit).",
    )

    class Meta:
        constraints = [models.CheckConstraint(condition=models.Q(weight__gte=1),
                                              name="team_weight_positive")]

    def __str__(self) -> str:
        return self.name


class ApiToken(models.Model):
    """A bearer token; only its sha256 is stored, the secret is shown once at creation."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="api_tokens")
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=12, help_text="The first characters, to recognise it.")
    key_sha256 = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["user", "created_at"])]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"


class UserLimits(models.Model):
    """Per-user overrides of farm limits (absent row: the settings' defaults apply)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                                related_name="limits")
    max_inflight_runs = models.PositiveIntegerField(default=100)
    max_priority = models.IntegerField(
        default=0, help_text="The highest run priority this user may ask for (staff set it)."
    )

    class Meta:
        verbose_name_plural = "user limits"

    def __str__(self) -> str:
        return f"limits for {self.user}"
