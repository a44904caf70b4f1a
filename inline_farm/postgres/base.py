"""Django's PostgreSQL backend whose pooled connections are checked without a round trip.

With CONN_HEALTH_CHECKS, psycopg's pool pings (an empty query) every connection it hands out:
one round trip more for every request of the web and every task of a worker, ~5 per run on
the hot path (bench/hotpath.py), each a wake-up of a PostgreSQL backend on a busy machine.

Here a connection leaves the pool as it is when its socket has nothing to read. A server that
restarted, or that terminated the session, has sent its FATAL notice or closed the socket,
which makes it readable; only then is the connection pinged (a notification can be waiting
too), and one that fails is discarded and the next one tried. A server that vanished without
closing the socket is found by the first query, as it would have been a moment after a ping.
"""

from __future__ import annotations

import select
from typing import Any

import psycopg
from django.db.backends.postgresql import base
from psycopg_pool import ConnectionPool


class DatabaseWrapper(base.DatabaseWrapper):
    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        pool = self.pool  # type: ignore[attr-defined]  # Django 5.1+, not in django-stubs
        if pool is None:
            return super().get_new_connection(conn_params)
        for _ in range(pool.max_size):  # every pooled connection may be dead (a restart)
            connection = super().get_new_connection(conn_params)
            if _usable(connection):
                return connection
            connection.close()
            pool.putconn(connection)  # closed: the pool drops it and opens a new one
        return super().get_new_connection(conn_params)


def _usable(connection: Any) -> bool:
    """Nothing waiting on the socket (no round trip), or else an answered ping."""
    if connection.closed or connection.broken:
        return False
    poller = select.poll()
    poller.register(connection.fileno(), select.POLLIN | select.POLLPRI)
    if not poller.poll(0):
        return True
    try:
        ConnectionPool.check_connection(connection)
    except psycopg.Error:
        return False
    return True
