"""The model families a worker holds, from its heartbeat's model files (torch-free)."""

from __future__ import annotations

from typing import Any


def worker_families(model_files: list[Any]) -> list[str]:
    """Sorted ids of every family some file of `model_files` belongs to."""
    return sorted({f for entry in model_files if isinstance(entry, dict)
                   for f in entry.get("families") or ()})
