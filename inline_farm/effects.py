"""Side effects, always after commit: publishing Celery tasks and channel-layer sends."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from django.db import transaction

log = logging.getLogger(__name__)


def publish_after_commit(task_name: str, *, args: list[Any], queue: str) -> None:
    """Publish `task_name(*args)` to `queue` once the current transaction commits."""
    transaction.on_commit(lambda: _publish(task_name, args, queue))


def _publish(task_name: str, args: list[Any], queue: str) -> None:
    from inline_farm.celery import app

    try:
        app.send_task(task_name, args=args, queue=queue)
    except Exception:  # a lost publish is re-done by the dispatcher's safety net
        log.exception("publishing %s%s to %s failed; the dispatcher will retry", task_name, args, queue)


def group_send_after_commit(group: str, message: dict[str, Any]) -> None:
    """Send `message` to a channel-layer group once the current transaction commits.

    Best effort and non-blocking: the send happens on this process's publisher thread, in the
    order the transactions committed, so a sampler never waits on Redis. The durable RunEvent
    log is the truth; websocket clients fill any gap from it.
    """
    transaction.on_commit(lambda: _publisher().send(group, message))


class _Publisher:
    """One event loop thread per process that sends channel-layer messages in FIFO order."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._queue: asyncio.Queue[tuple[str, dict[str, Any]]] | None = None
        ready = threading.Event()
        self._thread = threading.Thread(target=self._main, args=(ready,), name="channel-publisher",
                                        daemon=True)
        self._thread.start()
        ready.wait()

    def send(self, group: str, message: dict[str, Any]) -> None:
        assert self._queue is not None
        self._loop.call_soon_threadsafe(self._queue.put_nowait, (group, message))

    def _main(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._queue = asyncio.Queue()
        ready.set()
        self._loop.run_until_complete(self._drain())

    async def _drain(self) -> None:
        from channels.layers import get_channel_layer

        assert self._queue is not None
        layer = get_channel_layer()
        while True:
            group, message = await self._queue.get()
            if layer is None:
                continue
            try:
                await layer.group_send(group, message)
            except Exception:  # clients catch up from the durable log
                log.warning("channel-layer send to %s failed", group, exc_info=True)


_instance: list[_Publisher] = []
_instance_lock = threading.Lock()


def _publisher() -> _Publisher:
    with _instance_lock:
        if not _instance:
            _instance.append(_Publisher())
        return _instance[0]
