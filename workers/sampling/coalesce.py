"""Batched calls of a model that several run slots reach together (text encode, VAE decode).

`Coalescer(fn).call(item)` returns `fn([item, …])`'s answer for `item`, where the list holds
every request that was waiting when the call started: while one batch runs, the requests that
arrive queue up and go together in the next one. Nobody ever waits for company (a lone request
is `fn([item])` at once, exactly the unbatched call), so batching costs a lone run nothing.

Only requests with the same `key(item)` share a call (e.g. a latent's shape for a VAE decode);
a batch holds at most `max_items` requests and `max_cost` total `cost(item)`, the oldest first;
one over the budget alone still runs, alone. A failing call is retried on each half of its batch
down to single requests, so only the request that fails alone gets the error.

Every call runs on the process's device thread (workers/device/thread.py), as the step
batcher's forwards do.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from workers.device.thread import on_device_thread
from workers.sampling.batcher import is_out_of_memory, release_cached_memory

T = TypeVar("T")
R = TypeVar("R")


@dataclass(eq=False)
class _Request(Generic[T]):
    item: T
    result: Any = None
    error: BaseException | None = None
    done: bool = field(default=False)


def _one(item: Any) -> int:
    return 1


def _same(item: Any) -> Hashable:
    return None


class Coalescer(Generic[T, R]):
    """Calls `fn(items) -> results` (one result per item, same order) over concurrent requests."""

    def __init__(
        self,
        fn: Callable[[list[T]], list[R]],
        *,
        max_items: int = 16,
        max_cost: int = 1 << 30,
        cost: Callable[[T], int] = _one,
        key: Callable[[T], Hashable] = _same,
        observe: Callable[[int], None] | None = None,
    ) -> None:
        self._fn, self._cost, self._key, self._observe = fn, cost, key, observe
        self.max_items, self.max_cost = max_items, max_cost
        self._cond = threading.Condition()
        self._pending: list[_Request[T]] = []
        self._driving = False
        self.calls = 0  # successful calls of fn so far

    def call(self, item: T) -> R:
        request = _Request(item)
        with self._cond:
            self._pending.append(request)
        while True:
            with self._cond:
                while self._driving and not request.done:
                    self._cond.wait()
                if request.done:
                    break
                self._driving = True
                batch = self._take()
            try:
                self._run(batch)
            finally:
                with self._cond:
                    self._driving = False
                    self._cond.notify_all()
        if request.error is not None:
            raise request.error
        return request.result  # type: ignore[no-any-return]  # R, set by _run

    def _take(self) -> list[_Request[T]]:
        """The oldest request and those after it with its key that fit. Hold the condition."""
        first = self._pending[0]
        key = self._key(first.item)
        batch, cost = [first], self._cost(first.item)
        for request in self._pending[1:]:
            if len(batch) >= self.max_items:
                break
            c = self._cost(request.item)
            if self._key(request.item) == key and cost + c <= self.max_cost:
                batch.append(request)
                cost += c
        for request in batch:
            self._pending.remove(request)
        return batch

    def _run(self, batch: list[_Request[T]]) -> None:
        try:
            results = on_device_thread(self._fn, [request.item for request in batch])
        # Not swallowed: the request that fails alone gets it; its caller re-raises it.
        except Exception as exc:  # noqa: BLE001
            if is_out_of_memory(exc):
                release_cached_memory()
            if len(batch) == 1:
                batch[0].error, batch[0].done = exc, True
                return
            half = len(batch) // 2
            self._run(batch[:half])
            self._run(batch[half:])
            return
        for request, result in zip(batch, results, strict=True):
            request.result, request.done = result, True
        self.calls += 1
        if self._observe is not None:
            self._observe(len(batch))
