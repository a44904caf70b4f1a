"""What `GET /v1/health` reports: each dependency of this web process, probed cheaply.

The report is computed at most once per `CACHE_SECONDS` per process (a flood of health checks
from load balancers costs one probe round a second), each probe with a `PROBE_TIMEOUT`, so a
dead dependency answers in well under a second instead of hanging the caller.

`down` lists what makes the process unable to serve: the database (every request), the broker
(submits could not be dispatched) and the channel layer (live events; websockets fall back to
polling the log, but slower and at a cost). Live workers are reported and never "down": zero
workers is a fleet state, not a fault of this process — restarting or un-routing the web
process would not fix it, and the farm's launchers start the web process (and wait for its
health) before any worker.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from django.conf import settings
from django.db import connection

from apps.fleet.selectors import workers_live

CACHE_SECONDS = 1.0
STALE_SECONDS = 2.0
PROBE_TIMEOUT = 0.5

_lock = threading.Lock()
_cached: tuple[float, dict[str, Any]] | None = None


def health_report() -> dict[str, Any]:
    """`{status, database, broker, channelLayer, workers, down}`; cached for `CACHE_SECONDS`.

    One caller at a time refreshes a stale report; the others answer the previous one rather
    than wait for the probes (a flood of probes never queues behind a slow one)."""
    global _cached
    now = time.monotonic()
    cached = _cached
    if cached is not None and now - cached[0] < CACHE_SECONDS:
        return cached[1]
    if not _lock.acquire(blocking=cached is None):
        assert cached is not None
        return cached[1]  # someone is probing right now: the previous report is a second old
    try:
        if _cached is None or time.monotonic() - _cached[0] >= CACHE_SECONDS:
            _cached = (time.monotonic(), _probe())
        return _cached[1]
    finally:
        _lock.release()


def health_report_nowait() -> dict[str, Any] | None:
    """The cached report without ever blocking the caller (the event loop calls this).

    A report up to `STALE_SECONDS` old is answered as it is while one background thread
    refreshes it (under steady probing it never gets older than a probe round); `None` when
    there is none that fresh (the first call, or after a quiet spell: the caller then waits for
    `health_report` once, so a probe never reports an old state as current)."""
    cached = _cached
    if cached is None:
        return None
    age = time.monotonic() - cached[0]
    if age >= STALE_SECONDS:
        return None
    if age >= CACHE_SECONDS and not _lock.locked():
        threading.Thread(target=_refresh_quietly, name="health-probe", daemon=True).start()
    return cached[1]


def _refresh_quietly() -> None:
    from django.db import close_old_connections

    try:
        health_report()
    finally:
        close_old_connections()  # workers_live() used this thread's own connection


def _probe() -> dict[str, Any]:
    checks = {"database": _check(_database), "broker": _check(_broker),
              "channelLayer": _check(_channel_layer)}
    down = [name for name, state in checks.items() if state != "ok"]
    workers = None
    if checks["database"] == "ok":
        try:
            workers = workers_live().count()
        except Exception:  # noqa: BLE001 — reported as unknown, like a failed probe
            workers = None
    return {"status": "degraded" if down else "ok", **checks, "workers": workers, "down": down}


def _check(probe: Any) -> str:
    try:
        probe()
    except Exception as exc:  # noqa: BLE001 — health reports, it does not raise
        return f"error: {type(exc).__name__}"
    return "ok"


def _database() -> None:
    """A fresh connection, not one from the pool: the pool waits up to its `timeout` (20 s) for
    a connection when PostgreSQL is gone, and a busy pool is not a dead database."""
    import psycopg

    params = {**connection.get_connection_params(), "connect_timeout": 2}  # libpq's minimum
    with psycopg.connect(**params) as conn:
        conn.execute("SELECT 1")


def _broker() -> None:
    """Connect to BROKER_URL (Redis or RabbitMQ) through kombu, as Celery would, once."""
    from kombu import Connection

    broker = Connection(settings.BROKER_URL, connect_timeout=PROBE_TIMEOUT)
    try:
        broker.ensure_connection(max_retries=1, interval_start=0, interval_step=0,
                                 timeout=PROBE_TIMEOUT)
    finally:
        broker.release()


def _channel_layer() -> None:
    import redis

    client = redis.Redis.from_url(settings.CHANNEL_REDIS_URL, socket_timeout=PROBE_TIMEOUT,
                                  socket_connect_timeout=PROBE_TIMEOUT)
    try:
        client.ping()
    finally:
        client.close()
