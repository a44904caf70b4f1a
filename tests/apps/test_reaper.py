"""The reaper requeues runs whose worker stopped renewing the lease, then gives up with a reason."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.test import override_settings
from django.utils import timezone

from apps.graphs.models import Graph
from apps.runs.dispatch import runs_reap
from apps.runs.models import Run, RunEvent

pytestmark = pytest.mark.django_db


def _running(attempts: int, expires_in: float) -> Run:
    owner = get_user_model().objects.create(username=f"reaped-{attempts}-{expires_in}")
    graph = Graph.objects.create(sha256=f"{attempts:064d}", document={"nodes": {}})
    return Run.objects.create(
        owner=owner, graph=graph, target="out", status="running", attempts=attempts,
        lease_worker="w9@lost", lease_expires_at=timezone.now() + timedelta(seconds=expires_in),
        started_at=timezone.now(),
    )


@override_settings(INLINE_MAX_ATTEMPTS=3)
def test_an_expired_lease_puts_the_run_back_in_the_queue():
    run = _running(attempts=1, expires_in=-1)
    assert runs_reap() == 1
    run.refresh_from_db()
    assert (run.status, run.lease_expires_at, run.dispatched_at) == ("queued", None, None)
    event = RunEvent.objects.get(run=run)
    assert event.type == "status" and "w9@lost" in event.payload["reason"]


@override_settings(INLINE_MAX_ATTEMPTS=3)
def test_after_the_last_attempt_the_run_fails_with_the_reason():
    run = _running(attempts=3, expires_in=-1)
    runs_reap()
    run.refresh_from_db()
    assert run.status == "failed" and run.error_code == "worker_lost"
    assert "gave up after 3 attempts" in run.error_message
    assert RunEvent.objects.get(run=run).type == "run_done"


def test_a_live_lease_is_left_alone():
    run = _running(attempts=1, expires_in=60)
    assert runs_reap() == 0
    run.refresh_from_db()
    assert run.status == "running"
