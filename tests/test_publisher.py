"""The process's channel publisher (inline_farm/effects.py) sends through channels_redis's own
layer, on the real Redis: each run's events reach its watchers in order, and a Redis that is
down costs a batch, never the publisher."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from channels_redis.core import RedisChannelLayer
from django.conf import settings

from inline_farm.effects import _Publisher, _send_batch


def _layer(prefix: str) -> RedisChannelLayer:
    farm: Any = settings.CHANNEL_LAYERS["default"]["CONFIG"]  # the farm's hosts and expiry
    return RedisChannelLayer(**{**farm, "prefix": prefix})


async def _drain(layer: RedisChannelLayer, channel: str) -> list[dict[str, Any]]:
    got = []
    while True:
        try:
            got.append(await asyncio.wait_for(layer.receive(channel), 0.3))
        except TimeoutError:
            return got


def _seqs(inbox: list[dict[str, Any]]) -> list[int]:
    return [e["seq"] for m in inbox for e in (m["events"] if "events" in m else [m["event"]])]


def test_the_farm_sends_through_channels_redis_stock_layer() -> None:
    from channels.layers import get_channel_layer

    assert type(get_channel_layer()) is RedisChannelLayer


def test_the_publisher_sends_what_was_queued_in_order_per_run(caplog: pytest.LogCaptureFixture):
    """Runs' events queued interleaved reach each run's watcher in order, folded as
    `merge_run_events` folds them."""

    async def watch() -> Any:
        config: Any = settings.CHANNEL_LAYERS["default"]["CONFIG"]
        layer = _layer(config["prefix"])
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
        assert _seqs(inbox) == [1, 2, 3, 4, 5]
    assert "failed" not in caplog.text


def test_a_batch_to_a_redis_that_is_down_fails_quietly_and_the_next_one_goes(
        caplog: pytest.LogCaptureFixture):
    """The batch is dropped (logged; the durable log is the truth) and the layer sends again
    once Redis answers."""
    prefix = f"test-{uuid.uuid4().hex[:8]}"
    down = RedisChannelLayer(hosts=[{"address": "redis://127.0.0.1:1/0"}], prefix=prefix)
    asyncio.run(_send_batch(down, [("run-5", {"type": "run.event", "event": {"seq": 1}})]))
    assert "channel-layer send to run-5 failed" in caplog.text

    async def scenario() -> Any:
        layer = _layer(prefix)
        try:
            await layer.group_add("run-5", "plain.five")
            await _send_batch(layer, [("run-5", {"type": "run.event", "event": {"seq": 2}})])
            return await _drain(layer, "plain.five")
        finally:
            await layer.flush()
            await layer.close_pools()

    assert _seqs(asyncio.run(scenario())) == [2]
