"""`GET /v1/runs/{id}/events` — a run's events over a websocket (front door only).

Messages are JSON text frames, each with `type`, `runId` and `seq`:

- `snapshot` — first, once: `{run: <the run's wire state, takes so far>, lastSeq}`. Its `seq` is
  `lastSeq`, the log position it reflects; it is not itself a log entry.
- `status`, `progress`, `node_done`, `run_done` — entries of the run's durable log, seq 1, 2, 3…

Without `?after`, events follow the snapshot's `lastSeq`; `?after=N` first replays every logged
event with seq > N (an N past `lastSeq` is read as `lastSeq`: no client can have seen more).
Either way each seq arrives once, in order, with no gap (apps/runs/stream.py says how), except
that progress events may be coalesced (latest per node) for a client that reads too slowly.
A finished run still sends its `run_done` (unless `after` is already past it). After `run_done`
the server closes with 1000. Client frames are ignored.

Auth, any one of (the same API tokens as /v1):
- header `Authorization: Bearer <token>`;
- subprotocol `bearer.<token>`, for browsers, which cannot set headers:
  `new WebSocket(url, ["inline-farm.v1", "bearer." + token])`; the server echoes
  `inline-farm.v1`, or `bearer.<token>` when that was the only one offered;
- query `?token=<token>` (it lands in access logs; prefer the others).

Close codes:
- 1000 — the run finished; `run_done` was the last message.
- 1011 — internal error; reconnect with `?after=<the last seq you got>`.
- 4400 — `after` is not an integer >= 0.
- 4401 — no token, or an unknown or revoked one; also on an open socket within about a second
  of its token being revoked or its user deactivated (apps/accounts/watch.py).
- 4404 — no such run, or not one you may see (malformed ids too: existence never leaks).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from functools import partial
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from apps.accounts.selectors import user_for_token
from apps.accounts.services import token_hash
from apps.accounts.watch import credential_watch
from apps.runs.fanout import run_fanout
from apps.runs.selectors import run_events_wire_after, run_get_for_user, run_snapshot
from apps.runs.stream import RunEventStream
from inline_farm.ids import is_uuid

log = logging.getLogger(__name__)

# Reads run on the default thread pool, not the single thread-sensitive one: hundreds of sockets
# must not queue behind each other's catch-up reads.
_db = partial(database_sync_to_async, thread_sensitive=False)

SUBPROTOCOL = "inline-farm.v1"
BEARER_SUBPROTOCOL = "bearer."

CLOSE_DONE = 1000
CLOSE_INTERNAL = 1011
CLOSE_BAD_REQUEST = 4400
CLOSE_UNAUTHORIZED = 4401
CLOSE_NOT_FOUND = 4404


class RunEventsConsumer(AsyncWebsocketConsumer):
    """One client following one run; the stream logic lives in `RunEventStream`."""

    # No channel of its own: the process's fan-out (fanout.py) receives for every socket, and
    # survives a channel-layer outage by polling the log. With the default alias, Channels would
    # give each socket a channel and drop the socket (1006, no close frame) when Redis goes away.
    channel_layer_alias = "fanout-only (no such layer)"

    stream: RunEventStream | None = None
    pump: asyncio.Task[None] | None = None
    watching: tuple[str, str, int] | None = None

    async def connect(self) -> None:
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        token, subprotocol = credentials(self.scope, query)
        try:
            run, after = await self._admit(token, query)
        except Refused as refused:
            return await self._refuse(refused.code, subprotocol)
        except Exception:  # the database is unreachable: the client retries with ?after
            log.exception("opening an event stream failed")
            return await self._refuse(CLOSE_INTERNAL, subprotocol)

        run_id = str(run.pk)
        self.stream = RunEventStream(
            run_id=run_id, after=after, send=self._send_json,
            load_snapshot=partial(_db(run_snapshot), run_id=run_id),
            load_events=partial(_db(run_events_wire_after), run_id=run_id),
        )
        # Subscribe before the snapshot is read: no event can fall between the two.
        await run_fanout().subscribe(run_id, self.stream)
        await self.accept(subprotocol)
        self.pump = asyncio.create_task(self._pump())
        assert token is not None  # _admit found its user
        self.watching = credential_watch().watch("token", token_hash(token), self._revoked)

    async def _revoked(self) -> None:
        """The token stopped authenticating: stop streaming and say so."""
        if self.pump is not None:
            self.pump.cancel()
        with contextlib.suppress(OSError):
            await self.close(CLOSE_UNAUTHORIZED)

    async def _admit(self, token: str | None, query: dict[str, list[str]]) -> tuple[Any, int | None]:
        """(the run this client may follow, its `after`), or `Refused` with the close code."""
        user = await _db(user_for_token)(token) if token else None
        if user is None:
            raise Refused(CLOSE_UNAUTHORIZED)
        try:
            after = parse_after(query)
        except ValueError:
            raise Refused(CLOSE_BAD_REQUEST) from None
        run_id = self.scope["url_route"]["kwargs"]["run_id"]
        run = await _db(run_get_for_user)(user=user, run_id=run_id) if is_uuid(run_id) else None
        if run is None:
            raise Refused(CLOSE_NOT_FOUND)
        return run, after

    async def disconnect(self, code: int) -> None:
        if self.watching is not None:
            credential_watch().unwatch(self.watching)
        if self.pump is not None:
            self.pump.cancel()
        if self.stream is not None:
            await run_fanout().unsubscribe(self.stream.run_id, self.stream)

    async def _pump(self) -> None:
        assert self.stream is not None
        try:
            await self.stream.run()
            code = CLOSE_DONE
        except OSError:
            return  # the client went away mid-send; disconnect() cleans up
        except Exception:
            log.exception("event stream of run %s failed", self.stream.run_id)
            code = CLOSE_INTERNAL
        with contextlib.suppress(OSError):
            await self.close(code)

    async def _send_json(self, event: dict[str, Any]) -> None:
        await self.send(text_data=encoded(event))

    async def _refuse(self, code: int, subprotocol: str | None) -> None:
        # Accept first: a close before the handshake becomes an HTTP 403 and the code is lost.
        await self.accept(subprotocol)
        await self.close(code)


class Refused(Exception):
    """The connection is refused with `code` (after the handshake, so the client sees it)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


_ENCODED: dict[tuple[Any, Any], str] = {}  # (runId, seq) → JSON text, oldest first
_ENCODED_MAX = 4096


def encoded(event: dict[str, Any]) -> str:
    """The event as a JSON text frame, encoded once per process for all the sockets of its run
    (a log entry never changes; a snapshot is per client and never cached)."""
    if event["type"] == "snapshot":
        return json.dumps(event, separators=(",", ":"))
    key = (event["runId"], event["seq"])
    text = _ENCODED.get(key)
    if text is None:
        text = _ENCODED[key] = json.dumps(event, separators=(",", ":"))
        if len(_ENCODED) > _ENCODED_MAX:
            del _ENCODED[next(iter(_ENCODED))]
    return text


def credentials(scope: dict[str, Any], query: dict[str, list[str]]) -> tuple[str | None, str | None]:
    """(the API token the client presented, the subprotocol to echo on accept)."""
    offered = [str(p) for p in scope.get("subprotocols") or []]
    bearer_protocols = [p for p in offered if p.startswith(BEARER_SUBPROTOCOL)]
    echo = SUBPROTOCOL if SUBPROTOCOL in offered else next(iter(bearer_protocols), None)
    for name, value in scope.get("headers") or []:
        if name.lower() == b"authorization":
            scheme, _, secret = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and secret.strip():
                return secret.strip(), echo
    if bearer_protocols:
        return bearer_protocols[0][len(BEARER_SUBPROTOCOL):] or None, echo
    tokens = query.get("token") or [""]
    return tokens[0] or None, echo


def parse_after(query: dict[str, list[str]]) -> int | None:
    """`?after=N` as an int, None when absent; ValueError unless it is an integer >= 0."""
    values = query.get("after")
    if not values:
        return None
    raw = values[0].strip()
    if not (raw.isascii() and raw.isdigit()):
        raise ValueError(f"after={raw!r} is not an integer >= 0")
    return int(raw)
