"""The fan-out's outage rules (apps/runs/fanout.py) on an in-memory channel layer that can be
made to fail, and a fake log: polling while down, re-joining, no gap and no duplicate after.
Each wait is on a condition with a deadline; the follower keeps every event it is handed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from channels.layers import InMemoryChannelLayer

from apps.runs.events import run_group
from apps.runs.fanout import RunFanout


class FlakyLayer(InMemoryChannelLayer):
    """Channels' in-memory layer; while `down`, every call raises ConnectionError and pending
    receives fail, like channels-redis when Redis goes away. Coming back forgets the groups (a
    Redis restarted without persistence)."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.changed = asyncio.Event()

    def fail(self) -> None:
        self.down = True
        self.changed.set()

    def recover(self) -> None:
        self.down = False
        self.groups.clear()
        self.changed.set()

    def _check(self) -> None:
        if self.down:
            raise ConnectionError("the channel layer is down")

    async def group_add(self, group: str, channel: str) -> None:
        self._check()
        await super().group_add(group, channel)

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        self._check()
        await super().group_send(group, message)

    async def receive(self, channel: str) -> dict[str, Any]:
        self._check()
        self.changed.clear()
        receiving = asyncio.ensure_future(super().receive(channel))
        changed = asyncio.ensure_future(self.changed.wait())
        await asyncio.wait([receiving, changed], return_when=asyncio.FIRST_COMPLETED)
        changed.cancel()
        if receiving.done():
            return receiving.result()
        receiving.cancel()
        self._check()
        return await self.receive(channel)


class Log:
    """A run's durable log; `append` publishes after "commit" unless the layer is down."""

    def __init__(self, layer: FlakyLayer) -> None:
        self.layer, self.readable = layer, True
        self.events: list[dict[str, Any]] = []
        self.reads = 0

    async def append(self) -> None:
        event = {"type": "progress", "runId": "r", "seq": len(self.events) + 1}
        self.events.append(event)
        with contextlib.suppress(ConnectionError):  # effects.py logs it; the log has the event
            await self.layer.group_send(run_group("r"), {"type": "run.event", "event": event})

    async def load_events(self, *, run_id: str, after: int, limit: int) -> list[dict[str, Any]]:
        self.reads += 1
        if not self.readable:
            raise OSError("the database is down")
        return [e for e in self.events if e["seq"] > after][:limit]


class Follower:
    """A stream as the fan-out sees it. It keeps every event it is handed, duplicates included:
    a real stream drops those by seq (stream.py), which would hide one the fan-out sent."""

    def __init__(self) -> None:
        self.sent, self.rechecks = 0, 0
        self.got: list[int] = []

    def put(self, event: dict[str, Any]) -> None:
        self.got.append(event["seq"])
        self.sent = max(self.sent, event["seq"])  # what the fan-out's poll reads after

    def recheck(self) -> None:
        self.rechecks += 1


def fanout(layer: FlakyLayer, log: Log) -> RunFanout:
    fan = RunFanout(load_events=log.load_events, poll_seconds=0.01, retry_seconds=0.05,
                    timeout=1.0)
    fan.layer = layer
    return fan


async def until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Let the fan-out's task run until `check()` holds; fail naming `what` at the deadline."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, f"gave up waiting: {what}"
        await asyncio.sleep(0.005)


def test_events_keep_flowing_from_the_log_while_the_layer_is_down_then_live_again():
    async def scenario() -> tuple[list[int], RunFanout, Log]:
        layer = FlakyLayer()
        log = Log(layer)
        fan = fanout(layer, log)
        follower = Follower()
        await fan.subscribe("r", follower)
        for _ in range(3):
            await log.append()
        await until(lambda: len(follower.got) >= 3, "the first three events")
        assert follower.got == [1, 2, 3] and fan.healthy and log.reads == 0  # live

        layer.fail()
        await until(lambda: not fan.healthy, "the fan-out to notice the outage")
        for _ in range(3):
            await log.append()  # published nowhere: only the log has them
        await until(lambda: len(follower.got) >= 6, "the outage's events, from the log")
        assert follower.got == [1, 2, 3, 4, 5, 6]

        layer.recover()
        await until(lambda: fan.healthy, "the fan-out to take the layer again")
        assert "r" in fan.joined
        reads = log.reads
        for _ in range(3):
            await log.append()
        await until(lambda: len(follower.got) >= 9, "the events after the outage")
        assert log.reads == reads  # they came live: no more polling
        if fan.task is not None:
            fan.task.cancel()
        return follower.got, fan, log

    got, _, _ = asyncio.run(scenario())
    assert got == list(range(1, 10))  # every event once: no gap, no duplicate


def test_a_subscriber_that_arrives_during_an_outage_is_served_from_the_log():
    async def scenario() -> tuple[list[int], int]:
        layer = FlakyLayer()
        log = Log(layer)
        fan = fanout(layer, log)
        layer.fail()
        follower = Follower()
        await fan.subscribe("r", follower)  # never raises for the layer
        assert not fan.healthy
        for _ in range(2):
            await log.append()
        await until(lambda: len(follower.got) >= 2, "the outage's events, from the log")
        polled = log.reads
        layer.recover()
        await until(lambda: fan.healthy, "the fan-out to take the layer again")
        await log.append()
        await until(lambda: len(follower.got) >= 3, "the event after the outage")
        if fan.task is not None:
            fan.task.cancel()
        return follower.got, polled

    got, polled = asyncio.run(scenario())
    assert got == [1, 2, 3] and polled > 0  # every event once; the first two from the log


def test_when_the_log_fails_too_each_stream_is_told_to_read_it_itself():
    async def scenario() -> int:
        layer = FlakyLayer()
        log = Log(layer)
        fan = fanout(layer, log)
        follower = Follower()
        await fan.subscribe("r", follower)
        log.readable = False
        layer.fail()
        await until(lambda: follower.rechecks >= 1, "the stream to be told to read the log")
        if fan.task is not None:
            fan.task.cancel()
        return follower.rechecks

    assert asyncio.run(scenario()) >= 1
