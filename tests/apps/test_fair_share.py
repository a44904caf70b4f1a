"""Fair share between teams: by priority, then the team's running runs per unit of weight, then
the user's, then age."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.test import override_settings
from django.utils import timezone

from apps.accounts.models import Team
from apps.fleet.models import Worker
from apps.graphs.models import Graph
from apps.runs.dispatch import capacity_forget
from apps.runs.models import Run
from apps.runs.recovery import runs_dispatch

pytestmark = pytest.mark.django_db


@pytest.fixture
def queue_runs():
    graph = Graph.objects.create(sha256="f" * 64, document={"nodes": {}})
    made = iter(range(100_000))

    def make(team: Team, user: str, count: int, *, age: int) -> None:
        owner, _ = get_user_model().objects.get_or_create(username=user)
        team.members.add(owner)
        for _ in range(count):
            run = Run.objects.create(owner=owner, graph=graph, target=f"t{next(made)}",
                                     queue="gpu.24g")
            Run.objects.filter(pk=run.pk).update(
                created_at=timezone.now() - timedelta(seconds=age))

    return make


def _serve(slots: int) -> None:
    Worker.objects.update_or_create(name="gpu0@host", defaults={
        "queues": ["gpu.24g"], "slots": slots, "last_heartbeat": timezone.now()})
    capacity_forget()


def _teams_of_published(capture) -> Counter:
    with capture(execute=False):
        runs_dispatch()
    published = Run.objects.filter(dispatched_at__isnull=False)
    return Counter(published.values_list("owner__teams__name", flat=True))


@override_settings(INLINE_DISPATCH_WINDOW=0)
def test_a_team_that_queues_later_still_starts_before_most_of_a_big_backlog(
    queue_runs, django_capture_on_commit_callbacks
):
    a, b = Team.objects.create(name="A"), Team.objects.create(name="B")
    queue_runs(a, "alice", 40, age=100)  # queued first
    queue_runs(b, "bob", 4, age=10)
    _serve(8)
    assert _teams_of_published(django_capture_on_commit_callbacks) == {"A": 4, "B": 4}
    capacity_forget()


@override_settings(INLINE_DISPATCH_WINDOW=0)
def test_a_team_with_three_times_the_weight_gets_about_three_of_every_four_slots(
    queue_runs, django_capture_on_commit_callbacks
):
    a, b = Team.objects.create(name="A"), Team.objects.create(name="B", weight=3)
    queue_runs(a, "alice", 40, age=100)
    queue_runs(b, "bob", 40, age=10)
    _serve(8)
    assert _teams_of_published(django_capture_on_commit_callbacks) == {"A": 2, "B": 6}
    capacity_forget()
