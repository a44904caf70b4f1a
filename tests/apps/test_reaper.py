"""The reaper requeues the runs of lost workers and expired leases, then gives up with a reason."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.test import override_settings
from django.utils import timezone

from apps.fleet.models import Worker
from apps.graphs.models import Graph
from apps.runs.models import Run, RunEvent
from apps.runs.recovery import runs_reap

pytestmark = pytest.mark.django_db

LIVE = "w1@host#live"


@pytest.fixture(autouse=True)
def live_worker():
    """w1@host (incarnation `live`) heartbeats; any other lease holder is lost."""
    Worker.objects.create(name="w1@host", incarnation="live", last_heartbeat=timezone.now())


def _running(attempts: int, expires_in: float, worker: str = LIVE) -> Run:
    owner = get_user_model().objects.create(username=f"reaped-{attempts}-{expires_in}-{worker}")
    graph = Graph.objects.create(sha256=f"{attempts:064d}", document={"nodes": {}})
    return Run.objects.create(
        owner=owner, graph=graph, target="out", status="running", attempts=attempts,
        lease_worker=worker, lease_expires_at=timezone.now() + timedelta(seconds=expires_in),
        started_at=timezone.now(),
    )


@override_settings(INLINE_MAX_ATTEMPTS=3)
def test_an_expired_lease_puts_the_run_back_in_the_queue():
    run = _running(attempts=1, expires_in=-1)
    assert runs_reap() == 1
    run.refresh_from_db()
    assert (run.status, run.lease_expires_at, run.dispatched_at) == ("queued", None, None)
    event = RunEvent.objects.get(run=run)
    assert event.type == "status" and "w1@host" in event.payload["reason"]


@override_settings(INLINE_MAX_ATTEMPTS=3)
def test_a_lost_worker_s_run_is_requeued_long_before_its_lease_expires():
    run = _running(attempts=1, expires_in=60, worker="w9@gone#dead")
    assert runs_reap() == 1
    run.refresh_from_db()
    assert run.status == "queued"
    assert "w9@gone stopped heartbeating" in RunEvent.objects.get(run=run).payload["reason"]


@override_settings(INLINE_MAX_ATTEMPTS=3, INLINE_WORKER_LOST_SECONDS=10)
def test_a_worker_silent_past_the_lost_horizon_is_lost_and_a_restarted_one_is_new():
    Worker.objects.filter(name="w1@host").update(
        last_heartbeat=timezone.now() - timedelta(seconds=11))
    silent = _running(attempts=1, expires_in=60)
    assert runs_reap() == 1
    silent.refresh_from_db()
    assert silent.status == "queued"
    # The same name back with a new incarnation does not adopt the old process's runs.
    Worker.objects.filter(name="w1@host").update(incarnation="reborn",
                                                 last_heartbeat=timezone.now())
    orphan = _running(attempts=2, expires_in=60)
    assert runs_reap() == 1
    orphan.refresh_from_db()
    assert orphan.status == "queued"


@override_settings(INLINE_MAX_ATTEMPTS=3)
def test_after_the_last_attempt_the_run_fails_with_the_reason():
    run = _running(attempts=3, expires_in=-1)
    runs_reap()
    run.refresh_from_db()
    assert run.status == "failed" and run.error_code == "worker_lost"
    assert "gave up after 3 attempts" in run.error_message
    assert RunEvent.objects.get(run=run).type == "run_done"


def test_a_live_worker_s_live_lease_is_left_alone():
    run = _running(attempts=1, expires_in=60)
    assert runs_reap() == 0
    run.refresh_from_db()
    assert run.status == "running"
