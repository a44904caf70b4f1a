"""The worker's presence: one thread per process that heartbeats and renews every lease it holds.

Every INLINE_WORKER_HEARTBEAT seconds, independent of what the slots are doing (a long render
never delays it), it reports the worker (queues, slots, the runs it holds, model files, stats)
and extends the lease of each attempt it holds in one statement. An attempt missing from the
renewal's answer was cancelled, reaped or finished elsewhere: its `lost` event is set, so its
executor stops at the next check. A failed beat (database restarting, session terminated) is
logged and retried at the next beat: the farm declares a worker lost only after
INLINE_WORKER_LOST_SECONDS without any beat, several beats' worth.

Between beats the thread LISTENs on PostgreSQL's `inline_run_stop` channel: a cancel (or the
reaper taking a run away) NOTIFYs the run id as it commits, so the executor holding it stops at
its very next step instead of at its next ownership query.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import connection

from workers.counters import counters_report

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
        if not self._stop.is_set():  # a stop that came first (SIGTERM during startup) stands
            self._thread.start()

    def stop(self) -> None:
        """Stop beating and mark the worker offline. Also before `start`: a SIGTERM during the
        worker's startup runs Celery's shutdown before its `worker_ready`; joining the unstarted
        thread raised there, the offline mark was never written, and the worker stayed online
        until it aged out (INLINE_WORKER_LOST_SECONDS)."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=5)
        try:
            self._mark_offline()
        finally:
            connection.close()

    def _mark_offline(self) -> None:
        """Write the offline mark, retried on a fresh connection as a failed beat is.

        After a PostgreSQL restart this thread still held a session the server had ended: one
        try on it failed, and the worker stayed listed live until its beats aged out. Each
        failure closes the connection and tries again on another; a run worker's pool hands
        connections out unchecked (workers/tasks.py), so every dead one it holds fails once
        before a new session is made, hence short pauses first, growing to a beat interval
        while the server is away. It gives up once the farm no longer lists the worker anyway
        (INLINE_WORKER_LOST_SECONDS): from then on its silence tells."""
        from apps.fleet.services import worker_set_offline

        deadline = time.monotonic() + settings.INLINE_WORKER_LOST_SECONDS
        pause = 0.05
        while True:
            try:
                worker_set_offline(name=self.name, incarnation=self.incarnation)
                return
            except Exception:
                connection.close()
                if time.monotonic() + pause >= deadline:
                    log.warning("could not mark %s offline", self.name, exc_info=True)
                    return
                log.info("marking %s offline failed; retrying", self.name, exc_info=True)
            time.sleep(pause)
            pause = min(pause * 2, settings.INLINE_WORKER_HEARTBEAT)

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
        from workers.memory import meter

        return {**self.stats, **counters_report(), "busy": len(self.held()), "slots": self.slots,
                "memory": meter().report()}

    def _loop(self) -> None:
        listener = _StopListener()
        try:
            while not self._stop.is_set():
                listener.wait(settings.INLINE_WORKER_HEARTBEAT, self._stopped, self._stop)
                if self._stop.is_set():
                    break
                try:
                    self.beat()
                except Exception:  # retried at the next beat; only a long silence means lost
                    log.warning("heartbeat of %s failed; retrying next beat", self.name,
                                exc_info=True)
                    connection.close()
        finally:
            listener.close()
            connection.close()

    def _stopped(self, run_id: str) -> None:
        with self._lock:
            held = self._held.get(run_id)
        if held is not None:
            held.lost.set()


STOP_CHANNEL = "inline_run_stop"


class _StopListener:
    """A connection of its own LISTENing on STOP_CHANNEL (reconnected when it breaks)."""

    def __init__(self) -> None:
        self._conn: Any = None

    def wait(self, seconds: float, on_stop: Any, stop: threading.Event) -> None:
        """Deliver notified run ids to `on_stop` for `seconds` (or until `stop`)."""
        deadline = time.monotonic() + seconds
        while not stop.is_set() and (left := deadline - time.monotonic()) > 0:
            conn = self._connect()
            if conn is None:
                stop.wait(min(left, 1.0))
                continue
            try:
                for note in conn.notifies(timeout=min(left, 0.5)):
                    on_stop(note.payload)
            except Exception:  # a dropped connection: the next round reconnects
                log.info("stop listener lost its connection; reconnecting", exc_info=True)
                self.close()

    def _connect(self) -> Any:
        if self._conn is not None:
            return self._conn
        import psycopg

        try:
            params = connection.get_connection_params()
            self._conn = psycopg.connect(**{**params, "autocommit": True, "connect_timeout": 2})
            self._conn.execute(f"LISTEN {STOP_CHANNEL}")
        except Exception:  # the database is away: beats (and leases) still tell
            log.info("stop listener cannot connect yet", exc_info=True)
            self.close()
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):  # closing a broken connection
                self._conn.close()
            self._conn = None


_presence: list[Presence] = []


def presence_start(name: str, queues: list[str], slots: int) -> Presence:
    """Create this process's presence and beat once, synchronously, before any task is taken:
    a claim never names an incarnation the farm has not seen."""
    presence = Presence(name, queues, slots)
    presence.beat()
    _presence.append(presence)
    return presence


def offline_if_terminated_during_startup() -> None:
    """After `presence_start` the worker is in the live list, but Celery installs its SIGTERM
    handler (a warm shutdown, whose `worker_shutdown` marks the worker offline) only later in
    its startup: a SIGTERM in between killed the process with the default action and left it
    listed online until it aged out (INLINE_WORKER_LOST_SECONDS). Until Celery's handler
    replaces this one, a SIGTERM marks this process's presence offline, then ends the process
    as SIGTERM would have. Main thread only; a handler someone installed already is kept."""
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def terminated(signum: int, _frame: Any) -> None:
        me = presence()
        if me is not None:
            me.stop()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    with contextlib.suppress(ValueError):  # not the main thread: nothing to hand over to
        signal.signal(signal.SIGTERM, terminated)


def presence() -> Presence | None:
    return _presence[0] if _presence else None
