"""Side effects, always after commit: publishing Celery tasks and channel-layer sends."""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
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

    Best effort: the durable RunEvent log is the truth, and websocket clients resume from it.
    """
    transaction.on_commit(lambda: _group_send(group, message))


def _group_send(group: str, message: dict[str, Any]) -> None:
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(group, message)
    except Exception:  # see the docstring: clients catch up from the log
        log.warning("channel-layer send to %s failed", group, exc_info=True)
