"""Pooled connections leave the pool without a ping, and a dead one is never handed out
(inline_farm/postgres/base.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

pytestmark = pytest.mark.django_db(transaction=True)

MARKER = "SELECT pg_backend_pid() /* pooled-probe */"


def _on_pooled_connections(count: int, work: Callable[[], Any]) -> list[Any]:
    """Run `work` on `count` threads at once, each on its own connection from the pool, which
    it gives back at the end (as a request or a task does)."""
    results: list[Any] = [None] * count
    errors: list[Exception] = []
    together = threading.Barrier(count)

    def one(i: int) -> None:
        try:
            results[i] = work()
            together.wait(timeout=30)  # hold it until every thread has one: all distinct
        except Exception as exc:  # noqa: BLE001 — re-raised in the test's thread
            errors.append(exc)
            together.abort()
        finally:
            connection.close()  # with a pool: back into the pool

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def _pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute(MARKER)
        return int(cursor.fetchone()[0])


def _checkout_only() -> int:
    connection.ensure_connection()  # out of the pool; nothing run on it here
    return int(connection.connection.info.backend_pid)  # known locally, no query


def _last_query_of(pid: int) -> str | None:
    """What session `pid` ran last (pg_stat_activity); None once the session is gone."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [pid])
        row = cursor.fetchone()
    return None if row is None else str(row[0])


@pytest.fixture(autouse=True)
def _holding_my_connection() -> None:
    connection.ensure_connection()  # the test's own: the threads get other pooled ones


def test_a_healthy_pooled_connection_is_handed_out_without_a_ping() -> None:
    marked = set(_on_pooled_connections(3, _pid))  # the marker is each one's last query
    pid = _on_pooled_connections(1, _checkout_only)[0]
    assert pid in marked  # an idle pooled connection, not a new one
    # A ping would have run an empty query on it as it left the pool.
    assert _last_query_of(pid) == MARKER


def test_terminated_pooled_connections_are_replaced_not_handed_out() -> None:
    pids = set(_on_pooled_connections(4, _pid))
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) "
                       "FROM unnest(%s::int[]) AS pid", [sorted(pids)])
        assert cursor.fetchone()[0] == len(pids)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_last_query_of(p) is not None for p in pids):
        time.sleep(0.05)  # the sessions are gone: their sockets are closed

    again = _on_pooled_connections(4, _pid)  # every checkout works: no dead session handed out
    assert not pids & set(again)
