"""Open websockets follow their credential: revoked (or its user deactivated), they close with
4401 within about CHECK_SECONDS.

A request authenticates on every call (apps/accounts/selectors.py `user_for_token`); a socket
authenticates once, at connect. So each web process keeps one watch over the credentials its
open sockets hold and re-reads them every CHECK_SECONDS: one query per kind of credential per
second for the whole process, however many sockets, and none while no socket is open. A
revocation is a committed row, so this sees every revocation from any process (the admin, a
management command, another web) with no message to lose; a database that cannot be read keeps
the sockets open (their credential is not known to be revoked) and is asked again next time.

A kind of credential (API tokens and browser sessions here — a logout, a deactivation or a
password change ends a session — ComfyUI client keys in apps/importer) registers a
checker: sync, given the digests open sockets hold, it answers those still valid.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable
from functools import partial

from channels.db import database_sync_to_async

from apps.accounts.selectors import session_digests_valid, token_digests_valid

log = logging.getLogger(__name__)

CHECK_SECONDS = 1.0

Checker = Callable[[set[str]], set[str]]
OnRevoked = Callable[[], Awaitable[None]]

_checkers: dict[str, Checker] = {}


def credential_kind_register(kind: str, checker: Checker) -> None:
    """Make `kind` watchable: `checker(digests)` → the digests still valid (it reads the DB)."""
    _checkers[kind] = checker


class CredentialWatch:
    """The credentials of one process's open sockets, re-checked every CHECK_SECONDS."""

    def __init__(self) -> None:
        self.watched: dict[tuple[str, str], dict[int, OnRevoked]] = {}
        self.task: asyncio.Task[None] | None = None
        self.keys = itertools.count()

    def watch(self, kind: str, digest: str, on_revoked: OnRevoked) -> tuple[str, str, int]:
        """Call `on_revoked` (once) when the credential stops being valid; returns the handle
        `unwatch` takes. Call from the event loop."""
        if kind not in _checkers:
            raise KeyError(f"no checker registered for credentials of kind {kind!r}")
        key = next(self.keys)
        self.watched.setdefault((kind, digest), {})[key] = on_revoked
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._loop())
        return kind, digest, key

    def unwatch(self, handle: tuple[str, str, int]) -> None:
        kind, digest, key = handle
        callbacks = self.watched.get((kind, digest))
        if callbacks is not None:
            callbacks.pop(key, None)
            if not callbacks:
                del self.watched[(kind, digest)]

    async def _loop(self) -> None:
        while self.watched:
            await asyncio.sleep(CHECK_SECONDS)
            try:
                await self.check()
            except Exception:  # the database is away: nothing is known revoked; ask again
                log.warning("re-checking the credentials of open sockets failed", exc_info=True)

    async def check(self) -> None:
        """Close the sockets whose credential is no longer valid (one query per kind)."""
        by_kind: dict[str, set[str]] = {}
        for kind, digest in list(self.watched):
            by_kind.setdefault(kind, set()).add(digest)
        for kind, digests in by_kind.items():
            valid = await database_sync_to_async(partial(_checkers[kind], digests),
                                                 thread_sensitive=False)()
            for digest in digests - valid:
                for on_revoked in (self.watched.pop((kind, digest), None) or {}).values():
                    with contextlib.suppress(Exception):
                        await on_revoked()


credential_kind_register("token", token_digests_valid)
credential_kind_register("session", session_digests_valid)  # a browser's login (the editor)

_watch: dict[int, CredentialWatch] = {}  # one per event loop (a process runs one)


def credential_watch() -> CredentialWatch:
    """This event loop's watch (call from the loop)."""
    loop = asyncio.get_running_loop()
    watch = _watch.get(id(loop))
    if watch is None:
        _watch.clear()  # a new loop (tests start several): the old one's sockets are gone
        watch = _watch[id(loop)] = CredentialWatch()
    return watch
