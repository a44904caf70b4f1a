"""A small per-process LRU of loaded models, keyed by file hash and placement."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any


class ModelCache:
    """Keeps the `capacity` most recently used loaded models.

    Loads happen under the cache lock: two threads asking for the same 12 GB file load it once.
    Evicting drops the cache's reference only; a value still held elsewhere stays alive.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"model cache capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._items: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get_or_load(self, key: Hashable, load: Callable[[], Any]) -> Any:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
            value = load()
            self._items[key] = value
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)
            return value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        return len(self._items)


def _capacity_from_env() -> int:
    raw = os.environ.get("INLINE_MODEL_CACHE_SIZE", "").strip() or "4"
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"INLINE_MODEL_CACHE_SIZE must be an integer, got {raw!r}") from None


MODEL_CACHE = ModelCache(_capacity_from_env())
