"""The farm's channel layer (inline_farm/channel_layer.py) delivers exactly what channels_redis's
own `group_send` delivers: each scenario runs through both, on the real Redis, and the members'
inboxes must match — and through the farm's batched `group_send_blocking` (the publisher
thread's send: the scenario's sends as one batch), whose inboxes must match too."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from channels_redis.core import RedisChannelLayer
from django.conf import settings

from inline_farm.channel_layer import FarmChannelLayer

Sends = list[tuple[str, dict[str, Any]]]
Send = Callable[[Any, Sends], Awaitable[None]]
Scenario = Callable[[Any, str, Send], Awaitable[Any]]


async def _one_by_one(layer: Any, sends: Sends) -> None:
    for group, message in sends:
        await layer.group_send(group, message)


async def _batched(layer: Any, sends: Sends) -> None:
    layer.group_send_blocking(sends)  # blocking, as on the publisher's thread


def _layer(cls: type, prefix: str) -> Any:
    farm: Any = settings.CHANNEL_LAYERS["default"]["CONFIG"]  # the farm's hosts and expiry
    return cls(**{**farm, "prefix": prefix, "capacity": 3})


async def _drain(layer: Any, channel: str) -> list[dict[str, Any]]:
    got = []
    while True:
        try:
            got.append(await asyncio.wait_for(layer.receive(channel), 0.3))
        except TimeoutError:
            return got


def _all_three(scenario: Scenario) -> tuple[Any, Any, Any]:
    """Run `scenario(layer, prefix, send)` with channels_redis's layer and with the farm's, each
    with its own key prefix, sending one by one (`group_send`), then with the farm's layer
    sending the scenario's sends as one batch (`group_send_blocking`); what each left."""

    async def run(cls: type, send: Send) -> Any:
        prefix = f"test-{uuid.uuid4().hex[:8]}"
        layer = _layer(cls, prefix)
        try:
            return await scenario(layer, prefix, send)
        finally:
            await layer.flush()
            await layer.close_pools()

    return (asyncio.run(run(RedisChannelLayer, _one_by_one)),
            asyncio.run(run(FarmChannelLayer, _one_by_one)),
            asyncio.run(run(FarmChannelLayer, _batched)))


def test_every_member_gets_the_message_as_channels_redis_delivers_it():
    async def scenario(layer: Any, _prefix: str, send: Send) -> Any:
        local = [await layer.new_channel() for _ in range(2)]  # one process's "specific" channels
        plain = ["plain.one", "plain.two"]
        for channel in [*local, *plain]:
            await layer.group_add("run-1", channel)
        await layer.group_add("run-4", "plain.two")
        await send(layer, [("run-1", {"type": "run.event", "event": {"seq": 1}}),
                           ("nobody-watches", {"type": "run.event", "event": {"seq": 1}}),
                           ("run-4", {"type": "run.event", "event": {"seq": 7}}),
                           ("run-1", {"type": "run.event", "event": {"seq": 2}})])
        return [await _drain(layer, c) for c in [*local, *plain]]

    stock, ours, batched = _all_three(scenario)
    assert ours == stock and batched == stock
    assert all([m["event"]["seq"] for m in inbox] == [1, 2] for inbox in ours[:3])
    assert [m["event"]["seq"] for m in ours[3]] == [1, 7, 2]  # in both groups: in send order


def test_a_full_channel_drops_the_message_and_the_others_still_get_it():
    async def scenario(layer: Any, _prefix: str, send: Send) -> Any:
        for channel in ("full.one", "free.two"):
            await layer.group_add("run-2", channel)
        for seq in range(3):  # capacity 3
            await layer.send("full.one", {"type": "filler", "seq": seq})
        await send(layer, [("run-2", {"type": "run.event", "event": {"seq": 9}})])
        return [await _drain(layer, c) for c in ("full.one", "free.two")]

    stock, ours, batched = _all_three(scenario)
    assert ours == stock and batched == stock
    assert [m["type"] for m in ours[0]] == ["filler"] * 3 and ours[1][0]["event"]["seq"] == 9


def test_expired_members_and_expired_messages_are_dropped_before_the_send():
    async def scenario(layer: Any, prefix: str, send: Send) -> Any:
        await layer.group_add("run-3", "stale.member")
        await layer.group_add("run-3", "live.member")
        connection = layer.connection(0)
        # the stale member joined longer ago than group_expiry; an old message waits for live
        await connection.zadd(layer._group_key("run-3"), {"stale.member": 1})
        await connection.zadd(prefix + "live.member", {layer.serialize({"type": "old"}): 1})
        await send(layer, [("run-3", {"type": "run.event", "event": {"seq": 1}})])
        members = await connection.zrange(layer._group_key("run-3"), 0, -1)
        return sorted(members), await _drain(layer, "live.member"), await _drain(layer, "stale.member")

    stock, ours, batched = _all_three(scenario)
    assert ours == stock and batched == stock
    assert ours[0] == [b"live.member"] and [m["type"] for m in ours[1]] == ["run.event"] and not ours[2]


def test_a_batch_to_a_redis_that_is_down_fails_quietly_and_the_next_one_goes():
    """The publisher's thread survives a Redis that refuses: the batch is dropped (logged; the
    durable log is the truth) and the layer sends again once Redis answers."""
    prefix = f"test-{uuid.uuid4().hex[:8]}"
    down = FarmChannelLayer(hosts=[{"address": "redis://127.0.0.1:1/0"}], prefix=prefix)
    down.group_send_blocking([("run-5", {"type": "run.event", "event": {"seq": 1}})])  # no raise

    async def scenario() -> Any:
        layer = _layer(FarmChannelLayer, prefix)
        try:
            await layer.group_add("run-5", "plain.five")
            layer.group_send_blocking([("run-5", {"type": "run.event", "event": {"seq": 2}})])
            return await _drain(layer, "plain.five")
        finally:
            await layer.flush()
            await layer.close_pools()

    assert [m["event"]["seq"] for m in asyncio.run(scenario())] == [2]


def test_the_publisher_sends_what_was_queued_in_order_per_run(caplog: pytest.LogCaptureFixture):
    """inline_farm/effects.py's publisher thread, on the real Redis: runs' events queued
    interleaved reach each run's watcher in order, folded as `merge_run_events` folds them."""
    from inline_farm.effects import _Publisher

    async def watch() -> Any:
        config: Any = settings.CHANNEL_LAYERS["default"]["CONFIG"]
        layer = _layer(FarmChannelLayer, config["prefix"])
        groups = [f"test-run-{uuid.uuid4().hex[:8]}" for _ in range(2)]
        channels = [await layer.new_channel() for _ in groups]
        for group, channel in zip(groups, channels, strict=True):
            await layer.group_add(group, channel)
        publisher = _Publisher()
        for seq in range(1, 6):
            for group in groups:
                publisher.send(group, {"type": "run.event", "event": {"seq": seq}})
        assert publisher.flush(5.0)
        try:
            return [await _drain(layer, channel) for channel in channels]
        finally:
            for group, channel in zip(groups, channels, strict=True):
                await layer.group_discard(group, channel)
            await layer.close_pools()

    for inbox in asyncio.run(watch()):
        seqs = [e["seq"] for m in inbox for e in (m["events"] if "events" in m else [m["event"]])]
        assert seqs == [1, 2, 3, 4, 5]
    assert "failed" not in caplog.text


def test_the_farm_uses_its_layer() -> None:
    from channels.layers import get_channel_layer

    assert isinstance(get_channel_layer(), FarmChannelLayer)
