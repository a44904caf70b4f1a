"""Invariants that Postgres itself enforces."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.utils import timezone

from apps.graphs.models import Graph
from apps.runs.models import Run
from apps.takes.models import Take

pytestmark = pytest.mark.django_db


@pytest.fixture
def run():
    owner = get_user_model().objects.create(username="inv-owner")
    graph = Graph.objects.create(sha256="a" * 64, document={"nodes": {}})
    return Run.objects.create(owner=owner, graph=graph, target="out")


def _take(run, **kw):
    return Take.objects.create(run=run, owner=run.owner, node_id="out", sha256="b" * 64,
                               media_type="image/png", size=3, **kw)


def test_a_take_can_never_be_updated(run):
    take = _take(run)
    with pytest.raises(IntegrityError, match="immutable"), transaction.atomic():
        Take.objects.filter(pk=take.pk).update(sha256="c" * 64)


def test_a_slot_holds_one_take(run):
    _take(run)
    with pytest.raises(IntegrityError), transaction.atomic():
        _take(run)


def test_one_client_run_id_per_owner(run):
    Run.objects.filter(pk=run.pk).update(client_run_id="k")
    other = Graph.objects.create(sha256="d" * 64, document={"nodes": {}})
    with pytest.raises(IntegrityError), transaction.atomic():
        Run.objects.create(owner=run.owner, graph=other, target="out", client_run_id="k")


def test_a_running_run_must_hold_a_lease(run):
    with pytest.raises(IntegrityError), transaction.atomic():
        Run.objects.filter(pk=run.pk).update(status="running")


def test_a_finished_run_must_have_a_finish_time(run):
    with pytest.raises(IntegrityError), transaction.atomic():
        Run.objects.filter(pk=run.pk).update(status="succeeded")
    Run.objects.filter(pk=run.pk).update(status="succeeded", finished_at=timezone.now())


def test_a_status_change_along_an_undeclared_edge_is_refused(run):
    from apps.runs.transitions import UndeclaredTransition, run_move

    Run.objects.filter(pk=run.pk).update(status="succeeded", finished_at=timezone.now())
    with pytest.raises(UndeclaredTransition, match="succeeded to running"):
        run_move(Run.objects.filter(pk=run.pk), source=["succeeded"], to="running")


def test_a_status_change_is_compare_and_set(run):
    from apps.runs.transitions import run_move

    moved = run_move(Run.objects.filter(pk=run.pk), source=["queued"], to="cancelled",
                     finished_at=timezone.now())
    again = run_move(Run.objects.filter(pk=run.pk), source=["queued"], to="cancelled",
                     finished_at=timezone.now())
    assert (moved, again) == (1, 0)


def test_an_asset_can_never_be_updated(run):
    from apps.takes.models import Asset

    asset = Asset.objects.create(owner=run.owner, sha256="e" * 64, media_type="image/png",
                                 size=3, width=1, height=1)
    for change in ({"sha256": "f" * 64}, {"original_name": "renamed.png"}, {"size": 4}):
        with pytest.raises(IntegrityError, match="takes_asset rows are immutable"), \
                transaction.atomic():
            Asset.objects.filter(pk=asset.pk).update(**change)
    asset.refresh_from_db()
    assert (asset.sha256, asset.size, asset.original_name) == ("e" * 64, 3, "")


def test_a_take_refuses_every_kind_of_update_and_says_which_row(run):
    take = _take(run)
    for change in ({"lineage": {"seed": 1}}, {"node_id": "other"}, {"width": 9}):
        with pytest.raises(IntegrityError, match=f"takes_take rows are immutable \\(id {take.pk}"), \
                transaction.atomic():
            Take.objects.filter(pk=take.pk).update(**change)
