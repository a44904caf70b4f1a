"""The worker's heartbeat: what it serves and holds, reported to Postgres every few seconds."""

from __future__ import annotations

import logging
import os
import socket
import threading

from django.conf import settings
from django.db import connection

log = logging.getLogger(__name__)

_current_run: dict[str, str | None] = {"id": None}


def current_run_set(run_id: str | None) -> None:
    _current_run["id"] = run_id


class Heartbeat:
    """Reports this worker every INLINE_WORKER_HEARTBEAT seconds until stopped."""

    def __init__(self, name: str, queues: list[str]) -> None:
        self.name, self.queues = name, queues
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="heartbeat", daemon=True)

    def start(self) -> None:
        self.beat()
        self._thread.start()

    def stop(self) -> None:
        from apps.fleet.services import worker_set_offline

        self._stop.set()
        self._thread.join(timeout=5)
        worker_set_offline(name=self.name)

    def beat(self) -> None:
        from apps.fleet.services import worker_heartbeat
        from workers.models.catalog import scan
        from workers.runners import RUNNERS
        from workers.runtime import policy

        worker_heartbeat(
            name=self.name, hostname=socket.gethostname(), pid=os.getpid(), queues=self.queues,
            node_types=sorted(RUNNERS), model_files=scan(settings.INLINE_MODELS_DIR),
            device=policy().describe(), current_run_id=_current_run["id"],
            pool_name=settings.INLINE_POOL,
        )

    def _loop(self) -> None:
        while not self._stop.wait(settings.INLINE_WORKER_HEARTBEAT):
            try:
                self.beat()
            except Exception:  # keep beating; a missed beat is not fatal
                log.exception("heartbeat failed")
                connection.close()
        connection.close()
