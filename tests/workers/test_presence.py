"""A worker's presence (workers/heartbeat.py): its fleet row is online once it has beaten and
offline once it stops — also when the stop comes before its heartbeat thread started, and
when SIGTERM comes during the worker's startup, before Celery has a handler for it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from apps.fleet.models import Worker
from workers.heartbeat import Presence

pytestmark = pytest.mark.django_db(transaction=True)

REPO = Path(__file__).resolve().parents[2]


def test_a_presence_stopped_before_it_started_marks_the_worker_offline_and_never_beats() -> None:
    me = Presence("early@test", ["cpu"], 1)
    me.beat()  # what presence_start does before any task
    assert Worker.objects.get(name="early@test").state == "online"
    me.stop()
    assert Worker.objects.get(name="early@test").state == "offline"
    me.start()  # `worker_ready` after the shutdown: no heartbeat thread, no beat
    assert not me._thread.is_alive() and Worker.objects.get(name="early@test").state == "offline"


_STARTING_WORKER = """
import os, time
import django
django.setup()
from workers.heartbeat import offline_if_terminated_during_startup, presence_start
presence_start("starting@test", ["cpu"], 1)  # what celeryd_after_setup does, before Celery's
offline_if_terminated_during_startup()       # own SIGTERM handler exists
print("listed", flush=True)
time.sleep(60)
"""


def test_a_worker_terminated_during_its_startup_is_marked_offline() -> None:
    """A real process, between its first beat and Celery's SIGTERM handler: SIGTERM marks it
    offline, and it still ends as SIGTERM ends a process."""
    from django.db import connection

    from tests.livefarm import database_url

    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "inline_farm.settings",
           "DATABASE_URL": database_url(connection.settings_dict)}
    proc = subprocess.Popen([sys.executable, "-c", _STARTING_WORKER], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "listed"
        assert Worker.objects.get(name="starting@test").state == "online"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == -signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()
    assert Worker.objects.get(name="starting@test").state == "offline"
