"""A pooled connection is checked as it leaves the pool without a round trip (inline_farm/db)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection

from inline_farm.db.base import check_quietly
from tests.livefarm import database_url

pytestmark = pytest.mark.django_db


@pytest.fixture
def dsn() -> str:
    return database_url(connection.settings_dict)


@pytest.fixture
def idle(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT 'the last statement' AS marker")
        yield conn


def _last_statement(dsn: str, pid: int) -> str | None:
    with psycopg.connect(dsn, autocommit=True) as other:
        row = other.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()
        return None if row is None else str(row[0])


def test_a_live_connection_passes_without_a_statement_sent(dsn: str, idle: Any) -> None:
    check_quietly(idle)
    check_quietly(idle)
    # psycopg's ping would have been the session's last statement (an empty one)
    assert _last_statement(dsn, idle.info.backend_pid) == "SELECT 'the last statement' AS marker"
    assert idle.execute("SELECT 1").fetchone() == (1,)


def test_a_connection_whose_session_was_terminated_fails_the_check(dsn: str, idle: Any) -> None:
    pid = idle.info.backend_pid
    with psycopg.connect(dsn, autocommit=True) as other:
        assert other.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone() == (True,)
    deadline = time.monotonic() + 10
    while _last_statement(dsn, pid) is not None:  # the backend is gone once it left the list
        assert time.monotonic() < deadline, "the terminated backend lingers"
        time.sleep(0.05)
    with pytest.raises(psycopg.OperationalError):
        check_quietly(idle)


def test_django_checks_its_pooled_connections_with_it() -> None:
    pool = connection.pool  # type: ignore[attr-defined]  # not in django-stubs
    assert pool is not None and pool._check is check_quietly
