"""The Django admin pages that studio leads and ops use render, with previews and actions."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from apps.graphs.models import Graph
from apps.runs.models import Run
from apps.takes.models import Take
from apps.takes.storage import blob_put
from tests.conftest import png

pytestmark = pytest.mark.django_db


@pytest.fixture
def lead(client):
    user = get_user_model().objects.create_superuser("lead", "lead@studio.test", "pw")
    client.force_login(user)
    return user


@pytest.fixture
def run_with_take(lead, data_dirs):
    graph = Graph.objects.create(sha256="e" * 64, document={"nodes": {
        "out": {"type": "image/save", "params": {}, "inputs": {}}}})
    run = Run.objects.create(owner=lead, graph=graph, target="out")
    data = png(8, 8)
    take = Take.objects.create(run=run, owner=lead, node_id="out", sha256=blob_put(data),
                               media_type="image/png", size=len(data), width=8, height=8)
    return run, take


def test_every_changelist_renders(client, run_with_take):
    for model in ("runs/run", "takes/take", "takes/asset", "accounts/apitoken", "accounts/team",
                  "fleet/worker", "fleet/workerpool", "graphs/graph"):
        assert client.get(f"/admin/{model}/").status_code == 200, model


def test_a_run_page_shows_its_graph_and_take_previews(client, run_with_take):
    run, take = run_with_take
    page = client.get(f"/admin/runs/run/{run.pk}/change/").content.decode()
    assert "image/save" in page and f"/admin/takes/take/{take.pk}/bytes/" in page
    preview = client.get(f"/admin/takes/take/{take.pk}/bytes/")
    assert preview.status_code == 200 and preview["Content-Type"] == "image/png"


def test_the_cancel_action_cancels_queued_runs(client, run_with_take):
    run, _ = run_with_take
    client.post("/admin/runs/run/", {"action": "cancel_runs", "_selected_action": [run.pk]})
    run.refresh_from_db()
    assert run.status == "cancelled"
