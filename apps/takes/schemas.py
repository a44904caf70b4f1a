"""Response schemas of /v1/takes and /v1/assets (the shapes apps/takes/wire.py builds)."""

from __future__ import annotations

from inline_farm.schemas import WireOut


class TakeOut(WireOut):
    """One immutable output; lineage fields (graphSha256, nodeType, models…) ride along."""

    id: str
    runId: str
    nodeId: str
    index: int
    sha256: str
    mediaType: str
    size: int
    width: int | None
    height: int | None
    seed: int | None
    createdAt: str
    bytesUrl: str
    frameCount: int | None
    fps: float | None
    durationSeconds: float | None
    audioSeconds: float | None
    posterUrl: str


class AssetOut(WireOut):
    """A content-addressed upload."""

    id: str
    sha256: str
    mediaType: str
    size: int
    width: int | None
    height: int | None
    createdAt: str
