"""Beat's reroute pass moves queued runs off queues nobody serves; it reads the queued runs
only when the live fleet can have given them a better queue (apps/runs/recovery.py)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.fleet.models import Worker
from apps.graphs.models import Graph
from apps.runs import recovery
from apps.runs.dispatch import capacity_forget
from apps.runs.models import Run
from apps.runs.recovery import reroute_forget, runs_dispatch

pytestmark = pytest.mark.django_db

MODEL = {"folder": "diffusion_models", "name": "m.safetensors", "size": 1}
NEEDS_MODEL = {"nodeTypes": ["zimage/turbo"], "models": [{"folder": MODEL["folder"],
                                                          "name": MODEL["name"]}]}


def _orphan() -> Run:
    owner = get_user_model().objects.create(username=f"rr-{uuid.uuid4().hex[:8]}")
    graph = Graph.objects.create(sha256=uuid.uuid4().hex * 2, document={"nodes": {}})
    return Run.objects.create(owner=owner, graph=graph, target="out", queue="gpu.48g",
                              requirement=NEEDS_MODEL)


def _runs_read(queries: Any) -> int:
    return sum('FROM "runs_run"' in (q["sql"] or "") and "DISTINCT" in (q["sql"] or "")
               for q in queries)


def test_an_orphan_moves_when_the_fleet_changes_and_an_unchanged_fleet_is_not_rescanned(
        monkeypatch: pytest.MonkeyPatch) -> None:
    capacity_forget()
    reroute_forget()
    worker = Worker.objects.create(name="cpu@host", incarnation="1", queues=["cpu", "control"],
                                   slots=1, last_heartbeat=timezone.now())
    run = _orphan()

    with CaptureQueriesContext(connection) as first:
        runs_dispatch()  # nobody holds the model: the run waits where it is
    run.refresh_from_db()
    assert run.queue == "gpu.48g" and _runs_read(first) == 1

    monkeypatch.setattr(recovery, "REROUTE_SETTLE_S", 0.0)
    with CaptureQueriesContext(connection) as same:
        runs_dispatch()  # the same fleet as at the last look: no better queue can exist
    assert _runs_read(same) == 0

    worker.model_files = [MODEL]  # the cpu worker now holds the model
    worker.save(update_fields=["model_files"])
    with CaptureQueriesContext(connection) as changed:
        runs_dispatch()
    run.refresh_from_db()
    assert run.queue == "cpu" and _runs_read(changed) == 1

    monkeypatch.setattr(recovery, "REROUTE_FULL_EVERY_S", 0.0)
    with CaptureQueriesContext(connection) as periodic:
        runs_dispatch()  # past REROUTE_FULL_EVERY_S a pass looks whatever the fleet does
    assert _runs_read(periodic) == 1
