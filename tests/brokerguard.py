"""Tests purge broker queues only on a broker that is theirs (as the database must be `test_…`).

A broker is the tests' own when it is one of:
- the embedded Redis that `./farm test` started for this run (it lives in an `inline-farm-test-`
  temp dir; the server itself says where, so a look-alike URL cannot pass);
- Redis database TEST_REDIS_DB (10) of any server: the dedicated test database `.ci/run` uses;
- the URL in INLINE_TEST_BROKER, which whoever runs the tests sets to say "this one may be
  purged" (any other setup: RabbitMQ vhosts, another Redis database).
Anything else — the default `redis://127.0.0.1:6379/0` of a developer's or a production farm
above all — is refused before a single message is touched.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

TEST_REDIS_DB = 10
EMBEDDED_MARK = "inline-farm-test-"


def broker_refusal(url: str) -> str | None:
    """Why the tests must not purge the broker at `url`; None when it is theirs."""
    if url and url == os.environ.get("INLINE_TEST_BROKER"):
        return None
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        return (f"the broker {_safe(url)} is not known to be a test broker; set "
                f"INLINE_TEST_BROKER to this URL if the tests may purge it")
    if _redis_db(parts.path) == TEST_REDIS_DB:
        return None
    if EMBEDDED_MARK in _redis_dir(url):
        return None
    return (f"the broker {_safe(url)} is neither ./farm test's embedded Redis nor Redis db "
            f"{TEST_REDIS_DB}; the tests purge queues, so they refuse it (set INLINE_TEST_BROKER "
            f"to this URL if it really is a scratch broker)")


def assert_test_broker(url: str) -> None:
    reason = broker_refusal(url)
    assert reason is None, reason


def purge_queue(queue: str) -> int:
    """Drop every message of `queue` on the configured broker (which must be the tests')."""
    from django.conf import settings

    from inline_farm.celery import app

    assert_test_broker(settings.BROKER_URL)
    with app.connection_for_write() as conn:
        return int(conn.default_channel.queue_purge(queue) or 0)


def _redis_db(path: str) -> int:
    db = path.strip("/")
    return int(db) if db.isdigit() else 0


def _redis_dir(url: str) -> str:
    import redis

    try:
        with redis.Redis.from_url(url, socket_timeout=5) as client:
            return str(client.config_get("dir").get("dir", ""))
    except redis.RedisError:
        return ""  # unreachable, or CONFIG is disabled: not provably the tests' own


def _safe(url: str) -> str:
    parts = urlsplit(url)
    if parts.password:
        return url.replace(f":{parts.password}@", ":***@", 1)
    return url
