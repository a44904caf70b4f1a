"""One channel-layer subscription per run per web process, shared by that process's websockets.

Channels' `group_send` writes one copy of a message per member channel: with 200 sockets on one
run in one process, every event would be 200 Redis messages popped and decoded one by one by the
same process. Instead the process joins each watched run's group once, on its own channel, and
hands each event to its local streams in memory (`RunEventStream.put` never blocks, so one slow
socket cannot hold the others up).

Losing a message here is allowed: every stream reads gaps back from the durable log (stream.py).

While the channel layer is down
    A failed receive or group_add puts the fan-out in *polling* mode: every `poll_seconds` it
    reads each watched run's log after the highest seq it has handed out (one query per run per
    process, however many sockets follow it) and hands those events to the streams exactly like
    live ones. Every `retry_seconds` it tries to join every watched run's group again (a
    restarted Redis has forgotten them); once that works it reads the logs one last time and
    goes back to live events. No gap: an event committed before that last read is in it; one
    committed after it is published after commit, so after the groups were joined, and arrives
    live. Duplicates are dropped by seq in each stream. If the log cannot be read either, each
    stream is asked to read it itself (`recheck`), which fails the socket with 1011.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer

from apps.runs.events import run_group
from apps.runs.selectors import run_events_wire_after

log = logging.getLogger(__name__)

LoadEvents = Callable[..., Awaitable[list[dict[str, Any]]]]  # (run_id=, after=, limit=) → events


class Subscriber(Protocol):
    sent: int  # the highest seq this subscriber has already delivered

    def put(self, event: dict[str, Any]) -> None: ...

    def recheck(self) -> None: ...


class RunFanout:
    """The process's run subscriptions on one event loop (see `run_fanout`).

    One task (`_serve`) either reads the channel layer (`healthy`) or polls the log and retries
    the layer. `lock` serialises group membership changes with the re-join after an outage.
    """

    def __init__(
        self, *, load_events: LoadEvents | None = None, poll_seconds: float = 0.3,
        retry_seconds: float = 1.0, timeout: float = 2.0, page: int = 500,
    ) -> None:
        self.layer = get_channel_layer()
        self.load_events = load_events or database_sync_to_async(
            run_events_wire_after, thread_sensitive=False
        )
        self.poll_seconds, self.retry_seconds, self.timeout, self.page = (
            poll_seconds, retry_seconds, timeout, page
        )
        self.channel: str | None = None
        self.subscribers: dict[str, set[Subscriber]] = {}
        self.joined: set[str] = set()  # runs whose group our channel is in (while healthy)
        self.cursor: dict[str, int] = {}  # run → highest seq handed to its subscribers
        self.healthy = True  # optimistic until a layer call fails
        self.task: asyncio.Task[None] | None = None
        self.receiving: asyncio.Future[list[dict[str, Any]]] | None = None
        self.lock = asyncio.Lock()

    async def subscribe(self, run_id: str, subscriber: Subscriber) -> None:
        """Deliver the run's live events to `subscriber` from now on.

        When this returns, either the run's group is joined, or the fan-out is polling the log
        (then the next poll covers the run). It never raises for a channel-layer failure.
        """
        async with self.lock:
            self.subscribers.setdefault(run_id, set()).add(subscriber)
            if self.task is None or self.task.done():
                self.task = asyncio.create_task(self._serve())
            if self.healthy and run_id not in self.joined:
                try:
                    async with asyncio.timeout(self.timeout):
                        await self._join(run_id)
                except Exception:
                    log.warning("joining the channel group of run %s failed", run_id,
                                exc_info=True)
                    self._fail()

    async def unsubscribe(self, run_id: str, subscriber: Subscriber) -> None:
        async with self.lock:
            members = self.subscribers.get(run_id, set())
            members.discard(subscriber)
            if members or self.subscribers.pop(run_id, None) is None:
                return
            self.cursor.pop(run_id, None)
            if run_id in self.joined and self.channel is not None:
                self.joined.discard(run_id)
                try:
                    async with asyncio.timeout(self.timeout):
                        await self.layer.group_discard(run_group(run_id), self.channel)
                except Exception as exc:  # noqa: BLE001 — the membership expires with the group
                    log.info("leaving the channel group of run %s failed: %r", run_id, exc)

    async def _join(self, run_id: str) -> None:
        await self.layer.group_add(run_group(run_id), await self._channel())
        self.joined.add(run_id)

    async def _channel(self) -> str:
        """Our process-local channel. channels-redis keeps all process-local channels of one
        prefix in one Redis key, and `_receive_many` pops that whole key: a prefix of our own
        keeps any other process-local channel of this process out of it."""
        if self.channel is None:
            self.channel = await self.layer.new_channel(prefix=CHANNEL_PREFIX)
        return self.channel

    def _fail(self) -> None:
        """The layer failed: stop reading it; `_serve` switches to polling the log."""
        if self.healthy:
            log.warning("channel layer unavailable: following %d runs from the event log",
                        len(self.subscribers))
        self.healthy = False
        self.joined.clear()
        if self.receiving is not None and not self.receiving.done():
            self.receiving.cancel()

    async def _serve(self) -> None:
        while True:
            try:
                if self.healthy:
                    await self._read()
                else:
                    await self._recover()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug here must not leave the process's sockets unfed
                log.exception("run event fan-out failed; polling the log")
                self._fail()
                await asyncio.sleep(self.poll_seconds)

    async def _read(self) -> None:
        """Hand live events to subscribers until the layer fails."""
        await self._channel()
        receive = self._receive_many if _batch_readable(self.layer) else self._receive_one
        while self.healthy:
            receiving = self.receiving = asyncio.ensure_future(receive())
            try:
                await asyncio.wait([receiving])
            finally:
                if not receiving.done():  # we were cancelled ourselves
                    receiving.cancel()
            if receiving.cancelled():
                return  # `_fail` cancelled it
            error = receiving.exception()
            if error is not None:
                log.warning("reading the channel layer failed: %r", error)
                self._fail()
                return
            for message in receiving.result():
                for event in _events_of(message):
                    self._deliver(event)

    async def _receive_one(self) -> list[dict[str, Any]]:
        assert self.channel is not None
        return [await self.layer.receive(self.channel)]

    async def _receive_many(self) -> list[dict[str, Any]]:
        """Up to `BATCH` messages of our channel in one Redis round trip (blocking when none).

        channels-redis' `receive` costs four round trips per message (a cleanup script,
        BZPOPMIN, then adding to and deleting an in-flight backup so that a crashed consumer
        loses nothing): bench/events.py saw ~400 messages queued for the web process at 400
        events/s. We may lose messages (the log has them), so we pop them in bulk instead.
        Same keys, same serializer: the publishers' `group_send` is unchanged.
        """
        assert self.channel is not None
        local = self.layer.non_local_name(self.channel)
        key = self.layer.prefix + local
        redis = self.layer.connection(self.layer.consistent_hash(local))
        popped = await redis.zpopmin(key, BATCH)
        if not popped:
            blocked = await redis.bzpopmin(key, timeout=self.layer.brpop_timeout)
            popped = [] if blocked is None else [(blocked[1], blocked[2])]
        messages = []
        for content, _ in popped:
            message = self.layer.deserialize(content)
            targets = message.pop("__asgi_channel__", self.channel)
            if targets == self.channel or self.channel in targets:
                messages.append(message)
        return messages

    async def _recover(self) -> None:
        """Poll the log until the layer takes every watched run's group again."""
        loop = asyncio.get_running_loop()
        retry_at = loop.time() + self.retry_seconds
        while True:
            await self._poll()
            if self.subscribers and loop.time() >= retry_at:
                if await self._rejoin():
                    await self._poll()  # after the joins: closes the gap (module docstring)
                    log.warning("channel layer back: live events for %d runs",
                                len(self.subscribers))
                    return
                retry_at = loop.time() + self.retry_seconds
            await asyncio.sleep(self.poll_seconds)

    async def _rejoin(self) -> bool:
        async with self.lock:
            try:
                async with asyncio.timeout(self.timeout):
                    for run_id in list(self.subscribers):
                        await self._join(run_id)
            except Exception:  # noqa: BLE001 — still down: retried after `retry_seconds`
                self.joined.clear()
                return False
            self.healthy = True  # under the lock: a later subscribe joins its run itself
            return True

    async def _poll(self) -> None:
        await asyncio.gather(*(self._poll_run(run_id) for run_id in list(self.subscribers)))

    async def _poll_run(self, run_id: str) -> None:
        members = self.subscribers.get(run_id)
        if not members:
            return
        after = max([self.cursor.get(run_id, 0), *(s.sent for s in members)])
        try:
            events = await self.load_events(run_id=run_id, after=after, limit=self.page)
        except Exception:
            log.warning("reading the event log of run %s failed", run_id, exc_info=True)
            for subscriber in list(members):
                subscriber.recheck()  # each stream reads for itself; if that fails: 1011
            return
        for event in events:
            self._deliver(event)

    def _deliver(self, event: dict[str, Any]) -> None:
        run_id = event["runId"]
        members = self.subscribers.get(run_id)
        if not members:
            return
        self.cursor[run_id] = max(self.cursor.get(run_id, 0), event["seq"])
        for subscriber in list(members):
            subscriber.put(event)


BATCH = 500  # messages popped per round trip by `_receive_many`
CHANNEL_PREFIX = "runs-fanout"  # our process-local channel's prefix (see `RunFanout._channel`)


def _batch_readable(layer: Any) -> bool:
    """Whether `layer` is channels-redis' (its process-local channels live in one sorted set per
    process, which `_receive_many` pops directly); any other layer is read message by message."""
    try:
        from channels_redis.core import RedisChannelLayer
    except ImportError:
        return False
    return isinstance(layer, RedisChannelLayer)


def _events_of(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The run events in a channel message: one (`run.event`) or several (`run.events`, merged
    by the publisher in inline_farm/effects.py)."""
    if message.get("type") == "run.event":
        return [message["event"]]
    if message.get("type") == "run.events":
        return list(message["events"])
    return []


_fanouts: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, RunFanout] = (
    weakref.WeakKeyDictionary()
)


def run_fanout() -> RunFanout:
    """The fan-out of the running event loop (one per process under uvicorn)."""
    loop = asyncio.get_running_loop()
    if loop not in _fanouts:
        _fanouts[loop] = RunFanout()
    return _fanouts[loop]
