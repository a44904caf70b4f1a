"""Stored graph documents, content-addressed."""

from __future__ import annotations

from django.db import models


class Graph(models.Model):
    """A validated graph document (defaults filled in), stored once per content hash."""

    sha256 = models.CharField(max_length=64, unique=True)
    document = models.JSONField(help_text="The normalised graph; read it through GraphDoc.")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"graph {self.sha256[:12]}"
