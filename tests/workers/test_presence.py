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
from tests.workers.helpers import wait_for
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


def test_a_worker_whose_database_session_died_is_marked_offline_when_it_stops(
    tmp_path: Path,
) -> None:
    """A real Celery worker whose database sessions were terminated (what a PostgreSQL restart
    does to them) stops cleanly: its offline mark reconnects as a failed beat does, so the
    worker is offline as soon as it has exited, not listed live until its beats age out."""
    from django.db import connection

    from apps.fleet.selectors import workers_live
    from tests.livefarm import LiveFarm, database_url

    app_name = "presence-cut-off"  # libpq names the worker's sessions by PGAPPNAME
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "inline_farm.settings",
           "DATABASE_URL": database_url(connection.settings_dict), "PGAPPNAME": app_name,
           "INLINE_PROFILE": "cpu", "INLINE_MODELS_DIR": str(tmp_path),
           # No beat between the cut and the stop: only the stop itself may reconnect.
           "INLINE_WORKER_HEARTBEAT": "600", "INLINE_WORKER_LOST_SECONDS": "1200"}
    farm = LiveFarm(env=env, logs=tmp_path)
    try:
        name = farm.start_worker(queues="presence-test", slots=1)
        with connection.cursor() as cursor:
            # Two statements: in one, the planner may call pg_terminate_backend before it
            # filters by name, and end every session (this test's too).
            cursor.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s",
                           [app_name])
            cut = [pid for (pid,) in cursor.fetchall()]
            cursor.execute("SELECT bool_and(pg_terminate_backend(pid)) FROM unnest(%s) pid",
                           [cut])
            assert cut and cursor.fetchone() == (True,), "the worker's sessions were not cut"
        wait_for(lambda: not _sessions_alive(cut), 30, "the terminated sessions to end")
        farm.stop("worker", sig=signal.SIGTERM)  # returns once the process has exited
    finally:
        farm.stop_all()
    assert Worker.objects.get(name=name).state == "offline"
    assert not workers_live().filter(name=name).exists()


def _sessions_alive(pids: list[int]) -> bool:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", [pids])
        return bool(cursor.fetchone()[0])
