"""channels_redis's layer, with a `group_send` of one Redis round trip per step instead of two.

Every run event goes out as a `group_send` to the run's group (inline_farm/effects.py): two per
quick run (its `running` status, then its last events), from the worker's publisher thread.
channels_redis 4.3 spends four round trips on one — ZREMRANGEBYSCORE and ZRANGE on the group,
then a pipeline of ZREMRANGEBYSCOREs and an EVAL on the member channels — and two when nobody
watches the run, which is most runs. Each round trip is a pass through redis-py's asyncio client
on the publisher's loop: the publisher was ~19% of a worker's CPU in a burst of quick runs
(bench/hotpath.py under py-spy).

Here the group's expiry and read are one script, and the members' expiry, capacity check and
delivery another: one round trip for an unwatched run, two for a watched one. Same keys, same
serialized messages, same capacity and expiry rules, so receivers (channels_redis's own
`receive`, apps/runs/fanout.py) see no difference. It leans on two of channels_redis's private
helpers (`_group_key`, `_map_channel_keys_to_connection`), which is why channels-redis is pinned
below 5 in pyproject.toml; tests/test_channel_layer.py checks the behaviour against Redis.

The processes that publish (a worker's finishes, a web's cancels) call `group_send_blocking`
from their publisher thread (inline_farm/effects.py) with every message queued since its last
send: the same two scripts, but for the whole batch, pipelined on a plain (blocking) redis-py
client: one round trip per Redis host for the groups' members, one more for the deliveries
when anyone watches. Through the asyncio client each send was a task, timers and a pooled
connection's checks on the publisher's own event loop: with py-spy holding the GIL (--gil),
the publisher was ~17% of a worker's samples in a run of sequential quick runs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import redis
from channels_redis.core import RedisChannelLayer

log = logging.getLogger(__name__)

# KEYS[1]: the group's sorted set of member channels; ARGV[1]: members older than this go.
_GROUP_MEMBERS = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], 0, ARGV[1])
return redis.call('ZRANGE', KEYS[1], 0, -1)
"""

# KEYS: the member channels' message sets; ARGV: each key's message, then each key's capacity,
# then now, the keys' expiry (s) and the score below which a queued message has expired.
# channels_redis's own script, with the expired messages dropped in it rather than before it.
_DELIVER = """
local over_capacity = 0
local current_time = ARGV[#ARGV - 2]
local expiry = ARGV[#ARGV - 1]
local expired = ARGV[#ARGV]
for i=1,#KEYS do
    redis.call('ZREMRANGEBYSCORE', KEYS[i], 0, expired)
    if redis.call('ZCOUNT', KEYS[i], '-inf', '+inf') < tonumber(ARGV[i + #KEYS]) then
        redis.call('ZADD', KEYS[i], current_time, ARGV[i])
        redis.call('EXPIRE', KEYS[i], expiry)
    else
        over_capacity = over_capacity + 1
    end
end
return over_capacity
"""


class FarmChannelLayer(RedisChannelLayer):  # type: ignore[misc]  # channels_redis is untyped
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._blocking_clients: dict[int, redis.Redis] = {}  # by host index (`_blocking`)
        self._blocking_lock = threading.Lock()

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        """Send `message` to every channel in `group` (see the module's docstring)."""
        assert self.require_valid_group_name(group), "Group name not valid"
        connection = self.connection(self.consistent_hash(group))
        members = await connection.eval(
            _GROUP_MEMBERS, 1, self._group_key(group), int(time.time()) - self.group_expiry
        )
        if not members:
            return
        names = [m.decode("utf8") for m in members]
        by_connection, message_of, capacity_of = self._map_channel_keys_to_connection(names, message)
        for index, keys in by_connection.items():
            now = time.time()
            args = [message_of[k] for k in keys] + [capacity_of[k] for k in keys]
            args += [now, self.expiry, int(now) - int(self.expiry)]
            over = await self.connection(index).eval(_DELIVER, len(keys), *keys, *args)
            if over > 0:
                log.info("%s of %s channels over capacity in group %s", over, len(names), group)

    def group_send_blocking(self, sends: Sequence[tuple[str, dict[str, Any]]]) -> None:
        """`group_send` of each (group, message) of `sends`, in their order, from a thread
        without an event loop: each step's scripts for the whole batch go pipelined on one
        blocking client per Redis host (see the module's docstring). A step that fails on a
        host drops that host's messages of the batch, logged (the durable log is the truth:
        websocket clients fill a gap from it); the others still go."""
        cutoff = int(time.time()) - self.group_expiry
        members = self._eval_pipelined([
            (self.consistent_hash(group), _GROUP_MEMBERS, [self._group_key(group)], [cutoff])
            for group, _ in sends])
        deliveries: list[tuple[int, str, list[Any], list[Any]]] = []
        groups: list[tuple[str, int]] = []
        now = 0.0
        for (group, message), found in zip(sends, members, strict=True):
            if isinstance(found, Exception):
                log.warning("channel-layer send to %s failed: %s", group, found)
                continue
            if not found:
                continue
            names = [m.decode("utf8") for m in found]
            by_connection, message_of, capacity_of = self._map_channel_keys_to_connection(
                names, message)
            for index, keys in by_connection.items():
                # a channel's inbox is ordered by this score (its receive pops the lowest): the
                # batch's order, even where the clock gives two sends one reading
                now = max(time.time(), now + 1e-6)
                args = [message_of[k] for k in keys] + [capacity_of[k] for k in keys]
                args += [now, self.expiry, int(now) - int(self.expiry)]
                deliveries.append((index, _DELIVER, keys, args))
                groups.append((group, len(names)))
        for (group, count), over in zip(groups, self._eval_pipelined(deliveries), strict=True):
            if isinstance(over, Exception):
                log.warning("channel-layer send to %s failed: %s", group, over)
            elif over > 0:
                log.info("%s of %s channels over capacity in group %s", over, count, group)

    def _eval_pipelined(self, calls: Sequence[tuple[int, str, list[Any], list[Any]]]) -> list[Any]:
        """Each (host index, script, keys, args) of `calls` EVALed, pipelined per host; the
        results in the calls' order (an exception where a call or its host's round trip
        failed)."""
        results: list[Any] = [None] * len(calls)
        by_host: dict[int, list[int]] = {}
        for position, (index, *_) in enumerate(calls):
            by_host.setdefault(index, []).append(position)
        for index, positions in by_host.items():
            pipe = self._blocking(index).pipeline(transaction=False)
            for position in positions:
                _, script, keys, args = calls[position]
                pipe.eval(script, len(keys), *keys, *args)
            try:
                answers = pipe.execute(raise_on_error=False)
            except (redis.RedisError, OSError) as exc:  # the host's round trip: all failed
                answers = [exc] * len(positions)
            for position, answer in zip(positions, answers, strict=True):
                results[position] = answer
        return results

    def _blocking(self, index: int) -> redis.Redis:
        """A blocking client on host `index`, made as channels_redis makes its asyncio pools
        (channels_redis.utils.create_pool) from the same host settings."""
        clients = self._blocking_clients
        with self._blocking_lock:
            if index not in clients:
                host = dict(self.hosts[index])
                if "address" in host:
                    clients[index] = redis.Redis.from_url(host.pop("address"), **host)
                elif "master_name" in host:
                    from redis.sentinel import Sentinel

                    sentinel = Sentinel(host.pop("sentinels"),
                                        sentinel_kwargs=host.pop("sentinel_kwargs", None))
                    clients[index] = sentinel.master_for(host.pop("master_name"), **host)
                else:
                    clients[index] = redis.Redis(**host)
            return clients[index]

