"""The worker's cache of node outputs: an LRU bounded in bytes, scoped per owner.

Keys are Merkle keys (workers/executor.py `node_key`): node type + params + the keys of what
feeds the node, where a model loader's key includes the loaded file's content hash, so other
weights under the same file name never hit an old entry. Every key is scoped by the run's
owner: another user's identical graph computes its own outputs and never learns (through a
`cached: true`) that someone rendered it.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from typing import Any

Entry = tuple[dict[str, Any], dict[str, Any]]  # (outputs, lineage)


def size_of(value: Any) -> int:
    """Roughly how many bytes `value` keeps alive: images and tensors by their pixel data."""
    if hasattr(value, "width") and hasattr(value, "height") and hasattr(value, "getbands"):
        return int(value.width * value.height * len(value.getbands()))  # a PIL image
    if hasattr(value, "element_size") and hasattr(value, "nelement"):
        return int(value.element_size() * value.nelement())  # a torch tensor
    if isinstance(getattr(value, "nbytes", None), int):
        return int(value.nbytes)  # a numpy array, a mask
    if isinstance(value, dict):
        return sum(size_of(v) for v in value.values()) + 64
    if isinstance(value, list | tuple):
        return sum(size_of(v) for v in value) + 64
    return sys.getsizeof(value)


class NodeCache:
    """LRU of node outputs shared by the runs (slots) of one worker process; holds at most
    `max_bytes` (an entry larger than that is not kept)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: OrderedDict[str, tuple[Entry, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> Entry | None:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            return item[0]

    def put(self, key: str, outputs: dict[str, Any], lineage: dict[str, Any]) -> None:
        size = size_of(outputs)
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.bytes -= old[1]
            self._items[key] = ((outputs, lineage), size)
            self.bytes += size
            while self.bytes > self.max_bytes and self._items:
                _, (_, evicted) = self._items.popitem(last=False)
                self.bytes -= evicted

    def __len__(self) -> int:
        return len(self._items)


def default_cache_bytes() -> int:
    """A tenth of this machine's memory, at most 4 GiB (INLINE_NODE_CACHE_MB overrides)."""
    import os

    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        total = 8 << 30
    return int(min(total // 10, 4 << 30))
