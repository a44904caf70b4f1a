"""The websocket snapshot's read (apps/runs/selectors.py `run_snapshot`): one statement that
answers what the ORM's three queries answered."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.graphs.models import Graph
from apps.runs.models import Run, RunEvent
from apps.runs.selectors import run_snapshot
from apps.runs.wire import run_to_wire
from apps.takes.models import Take

pytestmark = pytest.mark.django_db


def _through_the_orm(run_id: Any) -> dict[str, Any]:
    """The snapshot as the ORM read it before (the run with its graph, its takes, its log)."""
    run = Run.objects.select_related("graph").prefetch_related("takes").get(pk=run_id)
    done_seq = (RunEvent.objects.filter(run_id=run_id, type="run_done")
                .order_by("seq").values_list("seq", flat=True).first())
    return {"run": run_to_wire(run), "lastSeq": run.last_seq, "doneSeq": done_seq}


def test_a_snapshot_is_one_statement_and_reads_what_the_orm_read():
    owner = get_user_model().objects.create(username="snap")
    graphs = [Graph.objects.create(sha256=c * 64, document={"nodes": {}}) for c in "ab"]
    queued = Run.objects.create(owner=owner, graph=graphs[0], target="out", queue="gpu.48g")
    finished = Run.objects.create(owner=owner, graph=graphs[1], target="out")
    for node_id, index in (("b", 0), ("a", 1), ("a", 0)):
        Take.objects.create(run=finished, owner=owner, node_id=node_id, index=index,
                            sha256=f"{ord(node_id) + index:064x}", media_type="image/png",
                            size=3, width=2, height=1)
    for seq, kind in enumerate(("status", "node_done", "run_done", "run_done"), start=1):
        RunEvent.objects.create(run=finished, seq=seq, type=kind, payload={})
    Run.objects.filter(pk=finished.pk).update(status="succeeded", finished_at=timezone.now(), last_seq=4)

    for run in (queued, finished):
        with CaptureQueriesContext(connection) as queries:
            snapshot = run_snapshot(run_id=run.pk)
        assert len(queries) == 1
        assert snapshot == _through_the_orm(run.pk)
    assert snapshot["doneSeq"] == 3 and snapshot["lastSeq"] == 4
    assert [(t["nodeId"], t["index"]) for t in snapshot["run"]["takes"]] == [
        ("b", 0), ("a", 1), ("a", 0)]  # as kept (Take's ordering: created_at first)
    with pytest.raises(Run.DoesNotExist):
        run_snapshot(run_id="00000000-0000-0000-0000-000000000000")
