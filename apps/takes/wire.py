"""Takes and assets in their wire shape (DESIGN.md: add fields freely, never rename)."""

from __future__ import annotations

from typing import Any

from apps.takes.models import Asset, Take


def take_to_wire(take: Take) -> dict[str, Any]:
    return {
        **take.lineage,  # graphSha256, nodeType, seed, models…; the columns below win
        "id": str(take.id),
        "runId": str(take.run_id),
        "nodeId": take.node_id,
        "index": take.index,
        "sha256": take.sha256,
        "mediaType": take.media_type,
        "size": take.size,
        "width": take.width,
        "height": take.height,
        "seed": take.seed,
        "createdAt": take.created_at.isoformat(),
        "bytesUrl": f"/v1/takes/{take.id}/bytes",
        # a clip's (video, animated WebP); null on a still image
        "frameCount": take.frame_count,
        "fps": take.fps,
        "durationSeconds": take.duration_seconds,
        "audioSeconds": take.audio_seconds,
        "posterUrl": f"/v1/takes/{take.id}/poster",
    }


def asset_to_wire(asset: Asset) -> dict[str, Any]:
    return {
        "id": str(asset.id),
        "sha256": asset.sha256,
        "mediaType": asset.media_type,
        "size": asset.size,
        "width": asset.width,
        "height": asset.height,
        "createdAt": asset.created_at.isoformat(),
    }
