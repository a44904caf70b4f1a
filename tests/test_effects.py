"""The Redis broker's direct publish (inline_farm/effects.py) writes what Celery would."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator

import pytest
import redis
from django.conf import settings

from inline_farm.celery import app
from inline_farm.effects import _publish, _redis_broker, task_message

pytestmark = pytest.mark.skipif(not settings.BROKER_URL.startswith("redis"),
                                reason="the direct publish is for Redis brokers")


@pytest.fixture
def scratch_queue() -> Iterator[tuple[redis.Redis, str]]:
    client = redis.Redis.from_url(settings.BROKER_URL)
    queue = f"test-effects-{uuid.uuid4().hex[:8]}"
    yield client, queue
    client.delete(queue)


def _shape(message: dict) -> dict:  # type: ignore[type-arg]
    """The envelope with what differs per message (ids, tags) blanked."""
    message = json.loads(json.dumps(message))
    task_id = message["headers"]["id"]
    for section in ("headers", "properties"):
        for key, value in message[section].items():
            if value == task_id or key == "delivery_tag":
                message[section][key] = "<id>"
    message["body"] = json.loads(base64.b64decode(message["body"]))
    return message


def test_the_envelope_is_the_one_send_task_writes_key_by_key(scratch_queue):
    client, queue = scratch_queue
    args = [str(uuid.uuid4())]
    app.send_task("workers.tasks.execute_run", args=args, queue=queue)
    by_celery = json.loads(client.rpop(queue))
    ours = json.loads(task_message("workers.tasks.execute_run", args, queue))
    assert _shape(ours) == _shape(by_celery)
    assert ours["headers"]["id"] != by_celery["headers"]["id"]  # a fresh task id each time
    assert ours["properties"]["correlation_id"] == ours["headers"]["id"] == ours["headers"]["root_id"]


def test_publish_pushes_onto_the_queue_named_list(scratch_queue):
    client, queue = scratch_queue
    assert _redis_broker() is not None
    _publish("workers.tasks.execute_run", ["run-1"], queue)
    _publish("workers.tasks.execute_run", ["run-2"], queue)
    sent = [json.loads(client.rpop(queue)) for _ in range(2)]  # kombu pops from the right: FIFO
    assert [json.loads(base64.b64decode(m["body"]))[0] for m in sent] == [["run-1"], ["run-2"]]
    assert client.llen(queue) == 0

