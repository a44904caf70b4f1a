"""Telling the farm's faults from a node's: infrastructure errors retry, they never fail a run.

A dropped database connection (a restart, a terminated session), a broker or channel-layer
hiccup during an attempt is a *worker fault*: the attempt is handed back and retried (fenced,
counted in `attempts`). Only a node's own error becomes the user's `node_failed`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import connection

log = logging.getLogger(__name__)

T = TypeVar("T")


class WorkerFault(Exception):
    """The infrastructure failed under an attempt; the run is retried, not failed."""


def _infrastructure_types() -> tuple[type[BaseException], ...]:
    import django.db.utils
    import kombu.exceptions
    import psycopg
    import redis.exceptions

    return (
        django.db.utils.OperationalError, django.db.utils.InterfaceError,
        psycopg.OperationalError, psycopg.InterfaceError,
        redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
        kombu.exceptions.OperationalError, ConnectionError,
    )


def is_infrastructure_error(exc: BaseException) -> bool:
    """Whether `exc` (or what caused it) is the database, broker or channel layer failing."""
    kinds = _infrastructure_types()
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kinds):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def db_retry(fn: Callable[[], T], *, tries: int = 4, first_wait: float = 0.1) -> T:
    """Call `fn`; on an infrastructure error close this thread's connection (the pool hands out
    a fresh one) and try again with backoff. Use only for writes that are safe to repeat
    (fenced compare-and-sets, idempotent inserts)."""
    for attempt in range(tries):
        try:
            return fn()
        except Exception as exc:
            if attempt == tries - 1 or not is_infrastructure_error(exc):
                raise
            log.warning("database call failed (%s); retrying", type(exc).__name__)
            connection.close()
            time.sleep(first_wait * 2**attempt)
    raise AssertionError("unreachable")
