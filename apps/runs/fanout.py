"""One channel-layer subscription per run per web process, shared by that process's websockets.

Channels' `group_send` writes one copy of a message per member channel: with 200 sockets on one
run in one process, every event would be 200 Redis messages popped and decoded one by one by the
same process. Instead the process joins each watched run's group once, on its own channel, and
hands each event to its local streams in memory (`RunEventStream.put` never blocks, so one slow
socket cannot hold the others up).

Losing a message here is allowed: every stream reads gaps back from the durable log (stream.py).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Any, Protocol

from channels.layers import get_channel_layer

from apps.runs.events import run_group

log = logging.getLogger(__name__)


class Subscriber(Protocol):
    def put(self, event: dict[str, Any]) -> None: ...


class RunFanout:
    """The process's run subscriptions on one event loop (see `run_fanout`)."""

    def __init__(self) -> None:
        self.layer = get_channel_layer()
        self.channel: str | None = None
        self.subscribers: dict[str, set[Subscriber]] = {}
        self.reader: asyncio.Task[None] | None = None
        self.lock = asyncio.Lock()

    async def subscribe(self, run_id: str, subscriber: Subscriber) -> None:
        """Deliver the run's live events to `subscriber` from now on (joined when this returns)."""
        async with self.lock:
            if self.channel is None:
                # The default "specific" prefix matters: channels-redis pops one Redis key per
                # prefix for process-local channels, and the consumers' channels use this one.
                self.channel = await self.layer.new_channel()
            if self.reader is None or self.reader.done():
                self.reader = asyncio.create_task(self._read())
            members = self.subscribers.setdefault(run_id, set())
            if not members:
                await self.layer.group_add(run_group(run_id), self.channel)
            members.add(subscriber)

    async def unsubscribe(self, run_id: str, subscriber: Subscriber) -> None:
        async with self.lock:
            members = self.subscribers.get(run_id, set())
            members.discard(subscriber)
            if not members and self.subscribers.pop(run_id, None) is not None:
                assert self.channel is not None
                await self.layer.group_discard(run_group(run_id), self.channel)

    async def _read(self) -> None:
        assert self.channel is not None
        while True:
            try:
                message = await self.layer.receive(self.channel)
            except asyncio.CancelledError:
                raise
            except Exception:
                # Redis went away for a moment: the streams catch up from the log meanwhile.
                log.warning("run event fan-out could not read the channel layer", exc_info=True)
                await asyncio.sleep(1.0)
                continue
            for event in _events_of(message):
                for subscriber in list(self.subscribers.get(event["runId"], ())):
                    subscriber.put(event)


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
