"""The dispatcher's policy: priority, then fair share (fewest running first), then age."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.test import override_settings
from django.utils import timezone

from apps.graphs.models import Graph
from apps.runs.dispatch import runs_dispatch
from apps.runs.models import Run

pytestmark = pytest.mark.django_db


@pytest.fixture
def make_run():
    graphs = iter(range(1, 10_000))
    User = get_user_model()

    def make(owner: str, *, status: str = "queued", priority: int = 0, age: int = 0) -> Run:
        user, _ = User.objects.get_or_create(username=owner)
        graph = Graph.objects.create(sha256=f"{next(graphs):064x}", document={"nodes": {}})
        extra = {"lease_expires_at": timezone.now() + timedelta(minutes=1)} if status == "running" else {}
        run = Run.objects.create(owner=user, graph=graph, target="out", status=status,
                                 priority=priority, queue="gpu.24g", **extra)
        Run.objects.filter(pk=run.pk).update(created_at=timezone.now() - timedelta(seconds=age))
        return run

    return make


def _published(django_capture_on_commit_callbacks) -> set:
    with django_capture_on_commit_callbacks(execute=False):
        runs_dispatch()
    return set(Run.objects.filter(dispatched_at__isnull=False).values_list("pk", flat=True))


@override_settings(INLINE_DISPATCH_WINDOW=2)
def test_a_user_with_nothing_running_goes_before_a_busy_user(make_run,
                                                              django_capture_on_commit_callbacks):
    make_run("busy", status="running")
    busy_old = make_run("busy", age=60)
    idle_a, idle_b = make_run("idle", age=10), make_run("idle", age=5)
    published = _published(django_capture_on_commit_callbacks)
    assert published == {idle_a.pk, idle_b.pk} and busy_old.pk not in published


@override_settings(INLINE_DISPATCH_WINDOW=1)
def test_priority_beats_fair_share_and_age(make_run, django_capture_on_commit_callbacks):
    make_run("busy", status="running")
    urgent = make_run("busy", priority=50)
    make_run("idle", age=600)
    assert _published(django_capture_on_commit_callbacks) == {urgent.pk}


@override_settings(INLINE_DISPATCH_WINDOW=2)
def test_the_window_bounds_unclaimed_messages_per_queue(make_run,
                                                        django_capture_on_commit_callbacks):
    for age in range(5):
        make_run("someone", age=age)
    assert len(_published(django_capture_on_commit_callbacks)) == 2
    assert len(_published(django_capture_on_commit_callbacks)) == 2  # still 2 outstanding
