"""Response schemas of /v1/health and /v1/workers."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from inline_farm.schemas import WireOut


class QueueHealthOut(WireOut):
    """One queue, in `/v1/health?detail=1`."""

    queued: int
    oldestQueuedSeconds: float
    running: int
    workers: int


class HealthOut(WireOut):
    """`status` ok (200) or degraded (503: a dependency named in `down` is unreachable)."""

    status: str
    database: str
    broker: str | None = None
    channelLayer: str | None = None
    workers: int | None
    down: list[str] = []
    queues: dict[str, QueueHealthOut] | None = None  # ?detail=1 (staff)


class WorkerOut(WireOut):
    name: str
    state: str
    pool: str | None = None
    queues: list[str]
    device: dict[str, Any]
    models: list[Any]
    families: list[str] = []  # the model families of the files it holds
    lastHeartbeat: str | None
    memory: dict[str, Any] | None = Field(
        default=None, description="Its memory at its last heartbeat: `kind` (cuda: torch's "
        "allocated bytes on its GPU; rss: the process's resident memory), `bytes`, and "
        "`baselineBytes` (at its start, before any model loaded).")
    host: str | None = Field(default=None, description="Its host name (staff callers only).")
    pid: int | None = Field(default=None, description="Its process id (staff callers only).")


class WorkersOut(WireOut):
    """The live workers."""

    items: list[WorkerOut]
