"""The farm's channel layer (inline_farm/channel_layer.py) delivers exactly what channels_redis's
own `group_send` delivers: each scenario runs through both, on the real Redis, and the members'
inboxes must match."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from channels_redis.core import RedisChannelLayer
from django.conf import settings

from inline_farm.channel_layer import FarmChannelLayer

Scenario = Callable[[Any, str], Awaitable[None]]


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


def _both(scenario: Scenario) -> tuple[Any, Any]:
    """Run `scenario(layer, prefix)` with each layer (own key prefix) and return what each left."""

    async def run(cls: type) -> Any:
        prefix = f"test-{uuid.uuid4().hex[:8]}"
        layer = _layer(cls, prefix)
        try:
            return await scenario(layer, prefix)
        finally:
            await layer.flush()
            await layer.close_pools()

    return asyncio.run(run(RedisChannelLayer)), asyncio.run(run(FarmChannelLayer))


def test_every_member_gets_the_message_as_channels_redis_delivers_it():
    async def scenario(layer: Any, _prefix: str) -> Any:
        local = [await layer.new_channel() for _ in range(2)]  # one process's "specific" channels
        plain = ["plain.one", "plain.two"]
        for channel in [*local, *plain]:
            await layer.group_add("run-1", channel)
        await layer.group_send("run-1", {"type": "run.event", "event": {"seq": 1}})
        await layer.group_send("run-1", {"type": "run.event", "event": {"seq": 2}})
        await layer.group_send("nobody-watches", {"type": "run.event", "event": {"seq": 1}})
        return [await _drain(layer, c) for c in [*local, *plain]]

    stock, ours = _both(scenario)
    assert ours == stock
    assert all([m["event"]["seq"] for m in inbox] == [1, 2] for inbox in ours)


def test_a_full_channel_drops_the_message_and_the_others_still_get_it():
    async def scenario(layer: Any, _prefix: str) -> Any:
        for channel in ("full.one", "free.two"):
            await layer.group_add("run-2", channel)
        for seq in range(3):  # capacity 3
            await layer.send("full.one", {"type": "filler", "seq": seq})
        await layer.group_send("run-2", {"type": "run.event", "event": {"seq": 9}})
        return [await _drain(layer, c) for c in ("full.one", "free.two")]

    stock, ours = _both(scenario)
    assert ours == stock
    assert [m["type"] for m in ours[0]] == ["filler"] * 3 and ours[1][0]["event"]["seq"] == 9


def test_expired_members_and_expired_messages_are_dropped_before_the_send():
    async def scenario(layer: Any, prefix: str) -> Any:
        await layer.group_add("run-3", "stale.member")
        await layer.group_add("run-3", "live.member")
        connection = layer.connection(0)
        # the stale member joined longer ago than group_expiry; an old message waits for live
        await connection.zadd(layer._group_key("run-3"), {"stale.member": 1})
        await connection.zadd(prefix + "live.member", {layer.serialize({"type": "old"}): 1})
        await layer.group_send("run-3", {"type": "run.event", "event": {"seq": 1}})
        members = await connection.zrange(layer._group_key("run-3"), 0, -1)
        return sorted(members), await _drain(layer, "live.member"), await _drain(layer, "stale.member")

    stock, ours = _both(scenario)
    assert ours == stock
    assert ours[0] == [b"live.member"] and [m["type"] for m in ours[1]] == ["run.event"] and not ours[2]


def test_the_farm_uses_its_layer() -> None:
    from channels.layers import get_channel_layer

    assert isinstance(get_channel_layer(), FarmChannelLayer)
