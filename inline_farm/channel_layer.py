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
"""

from __future__ import annotations

import logging
import time
from typing import Any

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
