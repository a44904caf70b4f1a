"""`GET /v1/runs/{id}` — the poll every client makes while its run goes — answered without
Django's request handler or ninja, on connections that leave their pool without a ping.

A client watching a run asks for it every few milliseconds; on the hot path (bench/hotpath.py)
the polls were most of the web process's requests. Through Django each one built a request,
ran the middleware, resolved the URL among the API's routes, let ninja authenticate, parse and
validate, and checked a pooled connection out with a ping (then: a round trip of its own, and
a PostgreSQL backend woken, before the one statement the answer needs; Django's check now asks
the socket instead, inline_farm/db/base.py).

Here, on the sync door's thread (inline_farm/sync_door.py), the door answers the one case that
matters, a plain 200: the token's user as this process remembers it (apps/accounts/selectors.py),
the same scoped statement as `run_get_for_user` (prepared), the same wire shape through the same
response schema and JSON encoder as ninja, the headers the API's middleware adds. Anything else
— a token this process has not seen in the last few seconds, a run the caller may not see, a
query string, a host Django would refuse, a database error — returns None and Django answers,
as before. tests/api/test_contract.py compares the two byte for byte.

Its connections come from a small pool of their own with no checkout ping. A read is safe to
repeat, so a connection that turns out dead (a terminated session, a restarted server) is
dropped and the read tried on the next one; past that, Django answers. Django's own pool keeps
its check (on the socket, a ping only when the socket has something to say: inline_farm/db): a
write cannot be repeated on another connection this simply.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from typing import Any

import psycopg
from django.conf import settings
from ninja.responses import NinjaJSONEncoder
from psycopg_pool import ConnectionPool

from apps.accounts.selectors import user_for_token_remembered
from apps.runs.schemas import RunOut
from apps.runs.selectors import RUN_VISIBLE, run_from_rows, run_visible_params, runs_to_wire

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Reply = tuple[int, list[tuple[bytes, bytes]], bytes]

_PATH = re.compile(r"/v1/runs/([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
                   r"[0-9a-fA-F]{12})")
POOL_SIZE = 4  # connections per web process, beside INLINE_DB_POOL_SIZE; polls are short reads
POOL_WAIT_S = 2.0  # then Django answers


class RunDoor:
    def __init__(self) -> None:
        self._pool: ConnectionPool | None = None
        self._pool_lock = threading.Lock()
        self._headers = _api_headers()
        # Redirects to https and HSTS depend on the request: Django answers when they are on.
        self.enabled = not (settings.SECURE_SSL_REDIRECT or settings.SECURE_HSTS_SECONDS)

    def wants(self, scope: Scope) -> bool:
        """A request the door may answer: a plain GET of one run, no query, no mount prefix."""
        return (self.enabled and scope["method"] == "GET" and not scope.get("query_string")
                and not scope.get("root_path") and _PATH.fullmatch(scope["path"]) is not None)

    def answer(self, scope: Scope) -> Reply | None:
        """The 200 Django would answer for this poll, or None: let Django answer."""
        from inline_farm.health_door import host_allowed

        match = _PATH.fullmatch(scope["path"])
        token = _bearer(scope)
        user = user_for_token_remembered(token) if token else None
        if match is None or user is None or not host_allowed(scope):
            return None
        try:
            wire = self._read(run_visible_params(user, match.group(1)))
            if wire is None:
                return None  # not found, or not theirs: Django's 404
            body = json.dumps(RunOut.model_validate(wire).model_dump(),
                              cls=NinjaJSONEncoder).encode()
        except Exception:  # Django answers (and reports) whatever this was
            log.debug("the run door passed a poll to Django", exc_info=True)
            return None
        return 200, [*self._headers, (b"Content-Length", str(len(body)).encode())], body

    def _read(self, params: dict[str, Any]) -> dict[str, Any] | None:
        pool = self._pool or self._open()
        for tries_left in reversed(range(POOL_SIZE + 1)):  # every pooled one may be dead
            conn = pool.getconn(timeout=POOL_WAIT_S)
            try:
                return _run_wire(conn, params)
            except psycopg.OperationalError:
                if (not conn.closed and not conn.broken) or not tries_left:
                    raise
                # dead: the pool drops it as it comes back, opens another, and we try the next
            finally:
                pool.putconn(conn)
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Close the door's connections (a web process keeps them for its life)."""
        with self._pool_lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None

    def _open(self) -> ConnectionPool:
        from django.db import connection

        with self._pool_lock:
            if self._pool is None:
                # As Django opens its pool (django/db/backends/postgresql/base.py): its adapters
                # (jsonb as text, time zone), autocommit; but no `check`.
                params = {**connection.get_connection_params(), "autocommit": True}
                self._pool = ConnectionPool(
                    kwargs=params, configure=connection._configure_connection,  # type: ignore[attr-defined]
                    min_size=1, max_size=POOL_SIZE, name="run-door", open=True)
            return self._pool


def _run_wire(conn: psycopg.Connection[Any], params: dict[str, Any]) -> dict[str, Any] | None:
    """What `get_run` (apps/runs/api.py) returns, read on the door's connection."""
    with conn.cursor() as cursor:
        cursor.execute(RUN_VISIBLE, params)
        run = run_from_rows(cursor.fetchall())
        return None if run is None else runs_to_wire([run], cursor)[0]


def _bearer(scope: Scope) -> str | None:
    """The token of `Authorization: Bearer <token>`, read as ninja's HttpBearer reads it (None
    for none, another scheme, or a header sent twice, which Django would join)."""
    values = [value for name, value in scope.get("headers") or () if name == b"authorization"]
    if len(values) != 1:
        return None
    scheme, _, token = values[0].decode("latin-1").partition(" ")
    return token if scheme.lower() == "bearer" and token else None


def _api_headers() -> list[tuple[bytes, bytes]]:
    """What a JSON 200 of the API carries after settings.API_MIDDLEWARE (SecurityMiddleware's
    and XFrameOptionsMiddleware's headers), besides its length."""
    headers = [("Content-Type", "application/json; charset=utf-8"),
               ("X-Frame-Options", settings.X_FRAME_OPTIONS.upper())]
    if settings.SECURE_CONTENT_TYPE_NOSNIFF:
        headers.append(("X-Content-Type-Options", "nosniff"))
    if settings.SECURE_REFERRER_POLICY:
        headers.append(("Referrer-Policy", settings.SECURE_REFERRER_POLICY))
    if settings.SECURE_CROSS_ORIGIN_OPENER_POLICY:
        headers.append(("Cross-Origin-Opener-Policy", settings.SECURE_CROSS_ORIGIN_OPENER_POLICY))
    return [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers]
