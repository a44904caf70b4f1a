"""A run handed back after an infrastructure fault is retried, but not forever."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.test import override_settings
from django.utils import timezone

from apps.graphs.models import Graph
from apps.runs.models import Run, RunEvent
from apps.runs.services import run_hand_back

pytestmark = pytest.mark.django_db


def _running(attempts: int) -> Run:
    owner = get_user_model().objects.create(username=f"handed-{attempts}")
    graph = Graph.objects.create(sha256=f"{attempts + 50:064d}", document={"nodes": {}})
    return Run.objects.create(owner=owner, graph=graph, target="out", status="running",
                              attempts=attempts, lease_worker="w#1", started_at=timezone.now(),
                              lease_expires_at=timezone.now() + timedelta(minutes=1))


@override_settings(INLINE_MAX_ATTEMPTS=3)
def test_a_fault_before_the_last_attempt_puts_the_run_back_in_the_queue():
    run = _running(attempts=2)
    assert run_hand_back(run_id=str(run.pk), attempt=2, reason="database restarting", fault=True)
    run.refresh_from_db()
    assert run.status == "queued"
    assert RunEvent.objects.get(run=run).payload["reason"] == "database restarting"


@override_settings(INLINE_MAX_ATTEMPTS=3)
def test_a_fault_on_the_last_attempt_fails_the_run_with_the_reason():
    run = _running(attempts=3)
    run_hand_back(run_id=str(run.pk), attempt=3, reason="statement timeout", fault=True)
    run.refresh_from_db()
    assert (run.status, run.error_code) == ("failed", "worker_fault")
    assert "statement timeout; gave up after 3 attempts" in run.error_message
    assert RunEvent.objects.get(run=run).type == "run_done"


@override_settings(INLINE_MAX_ATTEMPTS=3)
def test_a_stopping_worker_s_hand_back_is_never_capped():
    run = _running(attempts=3)
    assert run_hand_back(run_id=str(run.pk), attempt=3, reason="worker stopping")
    run.refresh_from_db()
    assert run.status == "queued"
