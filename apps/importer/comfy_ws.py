"""ComfyUI's `GET /ws?clientId=` on the farm: the events of a client's prompts as ComfyUI's
messages (front door only; the translation lives in comfy_messages.py).

A socket follows the prompts its owner queued with the same `client_id`: those in flight when it
connects, and every later one. Each prompt's run is followed from its durable event log, the
way /v1 websockets follow a run (apps/runs/stream.py: ordered, no gap, replayed from seq 1, so
a prompt that finished before the socket heard of it still tells its whole story). New prompts
are announced on a channel-layer group per (owner, client id) after commit; the socket also
looks for them every `POLL_SECONDS`, so a lost announcement or a channel-layer outage only
delays them.

Auth: `Authorization: Bearer <token>`, a client key in the URL (`/comfy/k/<key>/ws`), the
/v1 websocket fallbacks (subprotocol `bearer.<token>`, `?token=`), or the editor's Django
session (same origin only). Refused: close 4401; an open socket closes 4401 within about a
second of its token or key being revoked, its session ending (logout, password change), or its
user deactivated (apps/accounts/watch.py). A `clientId` PostgreSQL cannot store: close 4400.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from functools import partial
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.layers import get_channel_layer
from django.contrib.auth.models import User

from apps.accounts.selectors import session_digest, user_for_token
from apps.accounts.services import token_hash
from apps.accounts.watch import credential_watch
from apps.graphs.schema import text_problem
from apps.importer.comfy_api import same_origin
from apps.importer.comfy_door import (
    client_group,
    comfy_client_prompts,
    comfy_key_digest,
    comfy_queue_remaining,
    user_for_comfy_key,
)
from apps.importer.comfy_messages import Message, PromptMessages, status_message
from apps.runs.consumers import credentials
from apps.runs.fanout import run_fanout
from apps.runs.selectors import run_events_wire_after, run_snapshot
from apps.runs.stream import RunEventStream

log = logging.getLogger(__name__)

_db = partial(database_sync_to_async, thread_sensitive=False)

POLL_SECONDS = 2.0
CLOSE_INTERNAL = 1011
CLOSE_BAD_REQUEST = 4400
CLOSE_UNAUTHORIZED = 4401


def _user(key: str | None, token: str | None) -> User | None:
    if key is not None:
        return user_for_comfy_key(key) if text_problem(key) is None else None
    return user_for_token(token) if token else None


async def _session_user(scope: dict[str, Any]) -> User | None:
    """The editor's logged-in user (the session cookie, read by AuthMiddlewareStack), for a
    socket opened by a page of this farm: browsers send cookies to any site's websocket, so
    the Origin must be this host."""
    headers = {name.decode("latin-1").lower(): value.decode("latin-1")
               for name, value in scope.get("headers") or []}
    if not same_origin(headers.get("origin"), headers.get("host", ""), None):
        return None
    lazy = scope.get("user")
    user = await _db(lambda: lazy if lazy is not None and lazy.is_authenticated
                     and lazy.is_active else None)()
    return user if isinstance(user, User) else None


def _credential(key: str | None, token: str | None, user: User,
                session_key: str | None) -> tuple[str, str]:
    """(kind, digest) of the credential a socket was admitted with, for the watch."""
    if key is not None:
        return "comfy_key", comfy_key_digest(key)
    if token is not None:
        return "token", token_hash(token)
    return "session", session_digest(user.pk, session_key or "")  # none: never valid


class ComfyWsConsumer(AsyncWebsocketConsumer):
    """One ComfyUI client (`clientId`) of one user."""

    # No automatic channel: this socket manages its own group membership (see `_wait`) and
    # follows runs through the process's fan-out, so a channel-layer outage never drops it.
    channel_layer_alias = "comfy-door (own channel)"

    user: User
    client_id = ""
    main: asyncio.Task[None] | None = None
    watching: tuple[str, str, int] | None = None

    async def connect(self) -> None:
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        token, subprotocol = credentials(self.scope, query)
        key = self.scope["url_route"]["kwargs"].get("key")
        try:
            user = await _db(_user)(key, token)
            if user is None and key is None and token is None:
                user = await _session_user(self.scope)
        except Exception:
            log.exception("opening a ComfyUI socket failed")
            user = None
        await self.accept(subprotocol)
        if user is None:
            await self.close(CLOSE_UNAUTHORIZED)
            return
        client_id = (query.get("clientId") or [""])[0][:200]
        if text_problem(client_id) is not None:
            await self.close(CLOSE_BAD_REQUEST)
            return
        self.user = user
        self.client_id = client_id or uuid.uuid4().hex
        self.layer, self.channel, self.joined = get_channel_layer(), "", False
        self.followers: dict[Any, asyncio.Task[None]] = {}
        self.send_lock = asyncio.Lock()
        self.main = asyncio.create_task(self._serve())
        session = self.scope.get("session")
        kind, digest = _credential(key, token, user, getattr(session, "session_key", None))
        self.watching = credential_watch().watch(kind, digest, self._revoked)

    async def _revoked(self) -> None:
        """The credential stopped authenticating: stop following and say so."""
        for task in [self.main, *self.followers.values()]:
            if task is not None:
                task.cancel()
        with contextlib.suppress(OSError):
            await self.close(CLOSE_UNAUTHORIZED)

    async def disconnect(self, code: int) -> None:
        if self.watching is not None:
            credential_watch().unwatch(self.watching)
        tasks = [self.main, *getattr(self, "followers", {}).values()]
        for task in tasks:
            if task is not None:
                task.cancel()
        if getattr(self, "joined", False) and self.layer is not None:
            with contextlib.suppress(Exception):
                await self.layer.group_discard(self._group(), self.channel)

    def _group(self) -> str:
        return client_group(self.user.pk, self.client_id)

    async def _serve(self) -> None:
        try:
            await self._join()  # before the first read: no prompt falls between the two
            prompts, cursor = await _db(comfy_client_prompts)(
                owner_id=self.user.pk, client_id=self.client_id, after=None)
            await self._status(sid=self.client_id)
            while True:
                for prompt in prompts:
                    self._follow(prompt)
                if prompts:
                    await self._status()
                await self._wait()
                prompts, cursor = await _db(comfy_client_prompts)(
                    owner_id=self.user.pk, client_id=self.client_id, after=cursor)
        except (OSError, asyncio.CancelledError):
            return
        except Exception:
            log.exception("ComfyUI socket of client %s failed", self.client_id)
            with contextlib.suppress(OSError):
                await self.close(CLOSE_INTERNAL)

    async def _join(self) -> None:
        if self.layer is None:
            return
        try:
            async with asyncio.timeout(2.0):
                # A channel of its own Redis key, not a process-local "specific.…!" one: the
                # run fan-out pops this process's local key in bulk and would swallow ours.
                self.channel = self.channel or f"comfy-door.{uuid.uuid4().hex}"
                await self.layer.group_add(self._group(), self.channel)
            self.joined = True
        except Exception:
            log.warning("joining %s failed; polling for prompts", self._group(), exc_info=True)
            self.joined = False

    async def _wait(self) -> None:
        """Until a new prompt is announced, or `POLL_SECONDS` pass."""
        if not self.joined:
            await asyncio.sleep(POLL_SECONDS)
            await self._join()
            return
        try:
            async with asyncio.timeout(POLL_SECONDS):
                await self.layer.receive(self.channel)
        except TimeoutError:
            pass
        except Exception:
            log.warning("reading %s failed; polling for prompts", self._group(), exc_info=True)
            self.joined = False

    def _follow(self, prompt: Any) -> None:
        """Follow a prompt's run; a prompt is handed here once (numbers only grow)."""
        if prompt.pk in self.followers:
            return
        task = self.followers[prompt.pk] = asyncio.create_task(self._follow_run(prompt))
        task.add_done_callback(lambda _: self.followers.pop(prompt.pk, None))

    async def _follow_run(self, prompt: Any) -> None:
        messages = PromptMessages(prompt_id=str(prompt.pk), workflow=prompt.prompt)
        run_id = str(prompt.run_id)

        async def send(event: dict[str, Any]) -> None:
            for message in messages.of(event):
                await self._send(message)

        stream = RunEventStream(
            run_id=run_id, after=0, send=send,
            load_snapshot=partial(_db(run_snapshot), run_id=run_id),
            load_events=partial(_db(run_events_wire_after), run_id=run_id))
        await run_fanout().subscribe(run_id, stream)
        try:
            await stream.run()
            await self._status()
        except (OSError, asyncio.CancelledError):
            pass
        except Exception:
            log.exception("following run %s for a ComfyUI client failed", run_id)
        finally:
            await run_fanout().unsubscribe(run_id, stream)

    async def _status(self, sid: str | None = None) -> None:
        remaining = await _db(comfy_queue_remaining)(user=self.user)
        await self._send(status_message(remaining, sid))

    async def _send(self, message: Message) -> None:
        async with self.send_lock:
            if isinstance(message, bytes):
                await self.send(bytes_data=message)
            else:
                await self.send(text_data=json.dumps(message, separators=(",", ":")))
