"""Ops drain and resume a worker; the fleet view shows what each worker serves and holds."""

from __future__ import annotations

import time

import pytest

from tests.conftest import png, resize_graph, upload

pytestmark = pytest.mark.e2e


def _the_worker():
    from apps.fleet.selectors import workers_live

    return workers_live().order_by("-last_heartbeat").first()


def test_a_drained_worker_takes_no_new_runs_until_resumed(owner, db_access):
    from apps.fleet.services import worker_drain, worker_resume

    worker = _the_worker()
    assert worker_drain(worker=worker)
    time.sleep(1.0)  # the broadcast reaches the worker between tasks
    asset = upload(owner, png(16, 16, (1, 99, 1))).json()
    run_id = owner.post("/v1/runs", json=resize_graph(asset["id"], 8, 8)).json()["runId"]
    time.sleep(2.0)
    assert owner.get(f"/v1/runs/{run_id}").json()["status"] == "queued"
    worker.refresh_from_db()
    assert worker.state == "draining"

    assert worker_resume(worker=worker)
    assert owner.wait_run(run_id, timeout=30)["status"] == "succeeded"


def test_the_workers_endpoint_lists_queues_device_and_models(owner, db_access):
    items = owner.get("/v1/workers").json()["items"]
    assert items
    worker = next(w for w in items if w["name"] == _the_worker().name)
    assert {"cpu", "control"} <= set(worker["queues"])
    assert worker["device"]["profile"] == "cpu"
