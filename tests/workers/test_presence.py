"""A worker's presence (workers/heartbeat.py): its fleet row is online once it has beaten and
offline once it stops — also when the stop comes before its heartbeat thread started (a
SIGTERM during the worker's startup: Celery runs its shutdown before `worker_ready`)."""

from __future__ import annotations

import pytest

from apps.fleet.models import Worker
from workers.heartbeat import Presence

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_presence_stopped_before_it_started_marks_the_worker_offline_and_never_beats() -> None:
    me = Presence("early@test", ["cpu"], 1)
    me.beat()  # what presence_start does before any task
    assert Worker.objects.get(name="early@test").state == "online"
    me.stop()
    assert Worker.objects.get(name="early@test").state == "offline"
    me.start()  # `worker_ready` after the shutdown: no heartbeat thread, no beat
    assert not me._thread.is_alive() and Worker.objects.get(name="early@test").state == "offline"
