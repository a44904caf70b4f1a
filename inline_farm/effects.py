"""Side effects, always after commit: publishing Celery tasks and channel-layer sends."""

from __future__ import annotations

import atexit
import base64
import json
import logging
import queue
import threading
import uuid
from typing import Any

from django.db import transaction

log = logging.getLogger(__name__)


def publish_after_commit(task_name: str, *, args: list[Any], queue: str) -> None:
    """Publish `task_name(*args)` to `queue` once the current transaction commits."""
    transaction.on_commit(lambda: _publish(task_name, args, queue))


def _publish(task_name: str, args: list[Any], queue: str) -> None:
    try:
        client = _redis_broker()
        if client is not None:
            client.lpush(queue, task_message(task_name, args, queue))
        else:
            from inline_farm.celery import app

            app.send_task(task_name, args=args, queue=queue)
    except Exception:  # a lost publish is re-done by the dispatcher's safety net
        log.exception("publishing %s%s to %s failed; the dispatcher will retry", task_name, args, queue)


# --- the Redis broker's publish, without kombu ------------------------------------------------
#
# Every run is published once (a submit's or a finisher's dispatch), and `app.send_task` cost
# ~540 µs per message where the LPUSH itself costs ~130 µs (2,000 of each in a loop against the
# local Redis, on the 2-core box of bench/hotpath.py): Celery builds a signature, routes, stamps
# and wraps the publish in kombu's retry and producer layers. On a Redis broker, a message to a
# queue by name is one LPUSH of a JSON envelope onto the list named after the queue (kombu's
# virtual transport, the default exchange, priority 0). `task_message` writes that envelope as
# Celery 5's protocol 2 does; tests/test_effects.py checks it against one `send_task` wrote, key
# by key, and every e2e test's runs arrive through it. Other brokers (AMQP) go through `send_task`.

_broker: dict[str, Any] = {}
_broker_lock = threading.Lock()


def _redis_broker() -> Any:
    """A Redis client on the broker's database when the broker is a plain Redis URL; else None."""
    from django.conf import settings

    url = settings.BROKER_URL
    with _broker_lock:
        if _broker.get("url") != url:
            client = None
            options = settings.CELERY_BROKER_TRANSPORT_OPTIONS
            if url.startswith(("redis://", "rediss://")) and not options.get("global_keyprefix"):
                import redis
                from redis.backoff import ExponentialBackoff
                from redis.retry import Retry

                # Celery's publish retried 3 times; so does this. redis-py itself replaces an
                # idle pooled connection the broker dropped; the retry covers a command cut off
                # mid-way (Redis restarting), which would otherwise wait for the dispatcher's
                # safety net. A retry after a lost reply may push twice: a duplicate delivery is
                # a no-op (the claim's compare-and-set).
                client = redis.Redis.from_url(
                    url, retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 3),
                    retry_on_error=[redis.ConnectionError, redis.TimeoutError])
            _broker.update(url=url, client=client)
        return _broker["client"]


def task_message(task_name: str, args: list[Any], queue: str) -> str:
    """The envelope kombu's Redis transport stores for `send_task(task_name, args, queue=queue)`
    (Celery protocol 2, JSON body, base64 body encoding, no eta/expiry/retries/links)."""
    from celery.utils.nodenames import anon_nodename

    from inline_farm.celery import app

    task_id = str(uuid.uuid4())
    body = json.dumps([args, {}, {"callbacks": None, "errbacks": None, "chain": None,
                                  "chord": None}])
    return json.dumps({
        "body": base64.b64encode(body.encode()).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {
            "lang": "py", "task": task_name, "id": task_id, "shadow": None, "eta": None,
            "expires": None, "group": None, "group_index": None, "retries": 0,
            "timelimit": [None, None], "root_id": task_id, "parent_id": None,
            "argsrepr": repr(args), "kwargsrepr": "{}", "origin": anon_nodename(),
            "ignore_result": None, "replaced_task_nesting": 0, "stamped_headers": None,
            "stamps": {},
        },
        "properties": {
            "correlation_id": task_id, "reply_to": app.thread_oid, "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": queue}, "priority": 0,
            "body_encoding": "base64", "delivery_tag": str(uuid.uuid4()),
        },
    })


def group_send_after_commit(group: str, message: dict[str, Any]) -> None:
    """Send `message` to a channel-layer group once the current transaction commits.

    Best effort and non-blocking: the send happens on this process's publisher thread, in the
    order the transactions committed, so a sampler never waits on Redis. The durable RunEvent
    log is the truth; websocket clients fill any gap from it.
    """
    transaction.on_commit(lambda: _publisher().send(group, message))


class _Publisher:
    """One thread per process that sends channel-layer messages, in the order they were queued.

    Each time it wakes it takes everything queued (up to MAX_BATCH), folds each run's
    consecutive events into one message (`merge_run_events`) and sends the batch at once
    (`FarmChannelLayer.group_send_blocking`: one or two pipelined round trips for all its
    groups), so a busy process pays for Redis per batch, not per message, and messages of one
    group keep their order. At exit, it waits briefly for what is queued (see `flush`).
    """

    MAX_BATCH = 500

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[str, dict[str, Any]]] = queue.SimpleQueue()
        self._pending = 0
        self._idle = threading.Condition()
        self._thread = threading.Thread(target=self._main, name="channel-publisher", daemon=True)
        self._thread.start()
        atexit.register(self.flush)

    def send(self, group: str, message: dict[str, Any]) -> None:
        with self._idle:
            self._pending += 1
        self._queue.put((group, message))

    def flush(self, timeout: float = 2.0) -> bool:
        """Wait until every queued message was sent (or `timeout`); True when none is left."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout=timeout)

    def _main(self) -> None:
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        while True:
            batch = [self._queue.get()]
            while len(batch) < self.MAX_BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                if layer is not None:
                    _send_batch(layer, batch)
            except Exception:  # clients catch up from the durable log
                log.warning("channel-layer send of %d messages failed", len(batch), exc_info=True)
            finally:
                with self._idle:
                    self._pending -= len(batch)
                    self._idle.notify_all()


def _send_batch(layer: Any, batch: list[tuple[str, dict[str, Any]]]) -> None:
    """Send `batch` (group, message) pairs: per group in their order, each run's consecutive
    events folded into one message."""
    by_group: dict[str, list[dict[str, Any]]] = {}
    for group, message in batch:
        by_group.setdefault(group, []).append(message)
    sends = [(group, message) for group, messages in by_group.items()
             for message in merge_run_events(messages)]
    layer.group_send_blocking(sends)  # settings.CHANNEL_LAYERS: FarmChannelLayer


def merge_run_events(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Fold runs of consecutive `run.event` messages into one `run.events` message (in order).

    Under load the publisher finds several events of one run queued at once; one channel-layer
    message for them costs the receiving web process one Redis pop instead of many.
    """
    kinds = ("run.event", "run.events")
    merged: list[dict[str, Any]] = []
    for message in messages:
        previous = merged[-1] if merged else None
        if message.get("type") not in kinds or previous is None or previous["type"] not in kinds:
            merged.append(message)
            continue
        if previous["type"] == "run.event":
            merged[-1] = previous = {"type": "run.events", "events": [previous["event"]]}
        events = [message["event"]] if message["type"] == "run.event" else message["events"]
        previous["events"] = [*previous["events"], *events]
    return merged


_instance: list[_Publisher] = []
_instance_lock = threading.Lock()


def _publisher() -> _Publisher:
    with _instance_lock:
        if not _instance:
            _instance.append(_Publisher())
        return _instance[0]
