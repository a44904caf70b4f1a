"""Django's PostgreSQL backend, but a pooled connection is checked as it leaves the pool without
a round trip to the server.

With CONN_HEALTH_CHECKS and a pool, Django has psycopg ping every connection it checks out: an
empty statement, one round trip before the request's first statement, on every request that
touches the database (the submit's is one of its few). The ping exists to find a connection
whose session ended while it sat in the pool — terminated (`pg_terminate_backend`, an idle
timeout), or its server restarted or gone — and such a session always says so on its socket:
the server sends its FATAL error and closes, or the kernel closes the dead backend's end; the
idle socket becomes readable. An idle, healthy connection has nothing to read: these connections
LISTEN to nothing, and the server speaks on them only in answer to a statement. So
`check_quietly` asks the socket (one `poll`, no round trip): nothing to read, and the connection
goes out as it is; anything to read, and it gets psycopg's ping, which fails for a dead session
(the pool then drops it and hands out another, as before) and passes for anything else. A path
that died silently (no FIN, no error: a cable, a firewall) is found by neither without a
timeout; the ping would hang there too.

Measured (bench/ab.py, alternating): the web with no checkout ping at all against the ping,
sequential submit → done p50 20.09 → 19.11 ms, the web's CPU per run 9.50 → 9.10 ms; this
check against the ping, 18.32 → 18.90 ms and 12.76 → 12.64 ms — one round trip, inside that
bench's noise (README.md, tenth session). tests/test_db.py shows that no statement is sent.
The run door's pool (inline_farm/run_door.py) and a run worker's (workers/tasks.py) have no
check at all; they repeat their calls on a fresh connection instead.
"""

from __future__ import annotations

import select
from typing import Any

import psycopg
from django.db.backends.postgresql import base
from psycopg_pool import ConnectionPool


def check_quietly(conn: psycopg.Connection[Any]) -> None:
    """A psycopg_pool `check`: raise for a connection whose session has ended; no round trip
    unless its socket has something to say."""
    if conn.closed or conn.broken:
        raise psycopg.OperationalError("the connection is closed")
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN)
    if poller.poll(0):  # an error, an EOF, or anything else: ask the server
        ConnectionPool.check_connection(conn)


class DatabaseWrapper(base.DatabaseWrapper):
    @property
    def pool(self) -> Any:
        made = self.alias not in self._connection_pools  # type: ignore[attr-defined]  # not in django-stubs
        pool = super().pool  # type: ignore[misc]  # not in django-stubs
        if made and pool is not None and self.settings_dict["CONN_HEALTH_CHECKS"]:
            # Django passes psycopg's ping as the pool's `check` and takes no other (a `check`
            # in OPTIONS["pool"] would be a second one): the pool keeps it as `_check`.
            pool._check = check_quietly
        return pool
