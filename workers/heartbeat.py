"""The worker's presence: one thread per process that heartbeats and renews every lease it holds.

Every INLINE_WORKER_HEARTBEAT seconds, independent of what the slots are doing (a long render
never delays it), it reports the worker (queues, slots, the runs it holds, model files, stats)
and extends the lease of each attempt it holds in one statement. An attempt missing from the
renewal's answer was cancelled, reaped or finished elsewhere: its `lost` event is set, so its
executor stops at the next check. A failed beat (database restarting, session terminated) is
logged and retried at the next beat: the farm declares a worker lost only after
INLINE_WORKER_LOST_SECONDS without any beat, several beats' worth.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import connection

log = logging.getLogger(__name__)


@dataclass
class Held:
    """One attempt this process executes, and the flag that tells its executor to stop."""

    run_id: str
    attempt: int
    lost: threading.Event = field(default_factory=threading.Event)


class Presence:
    """This worker process as the farm sees it: its name, incarnation and the attempts it holds.

    `lease_key` ("name#incarnation") is what claims write into `Run.lease_worker`: a restarted
    process of the same name is a new incarnation, so its predecessor's runs are seen as lost at
    once instead of being renewed by the newcomer.
    """

    def __init__(self, name: str, queues: list[str], slots: int) -> None:
        self.name, self.queues, self.slots = name, queues, slots
        self.incarnation = secrets.token_hex(8)
        self.lease_key = f"{name}#{self.incarnation}"
        self.stats: Counter[str] = Counter()
        self.batch_sizes: Counter[int] = Counter()
        self.stopping = threading.Event()
        self._held: dict[str, Held] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="heartbeat", daemon=True)

    # --- the attempts held ---------------------------------------------------------------------

    def hold(self, run_id: str, attempt: int) -> Held:
        held = Held(run_id, attempt)
        with self._lock:
            self._held[run_id] = held
        return held

    def release(self, run_id: str) -> None:
        with self._lock:
            self._held.pop(run_id, None)

    def held(self) -> list[Held]:
        with self._lock:
            return list(self._held.values())

    # --- beating -------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        from apps.fleet.services import worker_set_offline

        self._stop.set()
        self._thread.join(timeout=5)
        try:
            worker_set_offline(name=self.name, incarnation=self.incarnation)
        except Exception:  # the database is gone: the reaper sees the silence instead
            log.warning("could not mark %s offline", self.name, exc_info=True)
        finally:
            connection.close()

    def beat(self) -> None:
        """Report the worker and renew its leases (raises on a database error)."""
        from apps.fleet.services import worker_heartbeat
        from apps.runs.services import run_leases_renew
        from workers.models.catalog import scan
        from workers.runners import RUNNERS
        from workers.runtime import policy

        held = self.held()
        running = [h.run_id for h in held]
        worker_heartbeat(
            name=self.name, hostname=socket.gethostname(), pid=os.getpid(), queues=self.queues,
            node_types=sorted(RUNNERS), model_files=scan(settings.INLINE_MODELS_DIR),
            device=policy().describe(), current_run_id=running[0] if running else None,
            pool_name=settings.INLINE_POOL, incarnation=self.incarnation, slots=self.slots,
            running=running, stats=self.stats_report(),
        )
        ours = run_leases_renew(worker=self.lease_key,
                                held=[(h.run_id, h.attempt) for h in held])
        for h in held:
            if h.run_id not in ours:
                h.lost.set()

    def stats_report(self) -> dict[str, Any]:
        return {**self.stats, "busy": len(self.held()), "slots": self.slots,
                "batchSizes": {str(k): v for k, v in sorted(self.batch_sizes.items())}}

    def _loop(self) -> None:
        while not self._stop.wait(settings.INLINE_WORKER_HEARTBEAT):
            try:
                self.beat()
            except Exception:  # retried at the next beat; only a long silence means lost
                log.warning("heartbeat of %s failed; retrying next beat", self.name, exc_info=True)
                connection.close()
        connection.close()


_presence: list[Presence] = []


def presence_start(name: str, queues: list[str], slots: int) -> Presence:
    """Create this process's presence and beat once, synchronously, before any task is taken:
    a claim never names an incarnation the farm has not seen."""
    presence = Presence(name, queues, slots)
    presence.beat()
    _presence.append(presence)
    return presence


def presence() -> Presence | None:
    return _presence[0] if _presence else None
