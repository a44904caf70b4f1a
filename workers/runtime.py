"""Process-wide state of one worker: its device policy and its node-output cache."""

from __future__ import annotations

from functools import cache
from typing import Any

from django.conf import settings

from workers.nodecache import NodeCache, default_cache_bytes


@cache
def policy() -> Any:
    """The device policy of this worker process, decided once (env: INLINE_PROFILE, …)."""
    from workers.device.detect import policy_from_env

    return policy_from_env()


@cache
def node_cache() -> NodeCache:
    mb = settings.INLINE_NODE_CACHE_MB
    return NodeCache(mb << 20 if mb else default_cache_bytes())
