"""The farm's Celery pool (settings.CELERY_WORKER_POOL): Celery's thread pool, whose finished
task wakes the worker's event loop.

Threads, not processes: the slots of one worker share its loaded models, node cache and step
batchers (a process per slot would load every model once per slot).

With the thread pool, a task that ends does not wake Celery's event loop, and kombu's Redis
transport re-arms its BRPOP (paused while every slot was reserved) only on a loop tick: with
nothing else waking it, a burst of short runs completed at ~4/s whatever the slots. A 20 ms
timer did it once, at ~0.47 ms of the loop's CPU per tick (23 ms of CPU a second on an idle
worker). Here each task's future, once done — after Celery's own callback has released the slot
— asks the loop to run once (`Hub.call_soon` is thread-safe and wakes a sleeping loop since
kombu 5.7); a slow tick stays as a safety net. This is Celery's documented extension point for
pools (a `BasePool` subclass named by `worker_pool`), through the pool interface's own hooks
(`register_with_event_loop`, `on_apply`).
"""

from __future__ import annotations

from typing import Any

from celery.concurrency import thread

SAFETY_TICK_S = 1.0


class ThreadPool(thread.TaskPool):
    """Celery's thread pool; a finished task wakes the worker's event loop (see the module)."""

    hub: Any = None

    def register_with_event_loop(self, loop: Any) -> None:
        super().register_with_event_loop(loop)
        self.hub = loop
        loop.call_repeatedly(SAFETY_TICK_S, _nothing)

    def on_apply(self, *args: Any, **kwargs: Any) -> thread.ApplyResult:
        result = super().on_apply(*args, **kwargs)
        hub = self.hub
        if hub is not None:
            result.f.add_done_callback(lambda _: hub.call_soon(_nothing))  # .f: its Future
        return result


def _nothing() -> None:
    pass
