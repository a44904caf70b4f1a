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
    from inline_farm.celery import app

    worker = _the_worker()
    assert worker_drain(worker=worker)
    deadline = time.monotonic() + 60  # until the broadcast reached the worker (between tasks)
    while "cpu" in _consumed_by(app, worker.name):
        assert time.monotonic() < deadline, "the worker never stopped consuming cpu"
        time.sleep(0.2)
    asset = upload(owner, png(16, 16, (1, 99, 1))).json()
    run_id = owner.post("/v1/runs", json=resize_graph(asset["id"], 8, 8)).json()["runId"]
    time.sleep(2.0)  # a window for the negative (nothing runs it), not a threshold
    assert owner.get(f"/v1/runs/{run_id}").json()["status"] == "queued"
    worker.refresh_from_db()
    assert worker.state == "draining"

    assert worker_resume(worker=worker)
    assert owner.wait_run(run_id, timeout=30)["status"] == "succeeded"


def _consumed_by(app, name: str) -> set[str]:
    """The queues the Celery worker `name` consumes now, as it answers a broadcast."""
    replies = app.control.inspect(destination=[name], timeout=5).active_queues() or {}
    return {q["name"] for q in replies.get(name, [])} if name in replies else {"cpu"}


def test_the_workers_endpoint_lists_queues_device_and_models(owner, db_access):
    items = owner.get("/v1/workers").json()["items"]
    assert items
    worker = next(w for w in items if w["name"] == _the_worker().name)
    assert {"cpu", "control"} <= set(worker["queues"])
    assert worker["device"]["profile"] == "cpu"


def test_a_run_executing_worker_yields_the_cpu_to_the_web(farm):
    """INLINE_WORKER_NICE (default 5): on a shared machine the API goes first."""
    import os

    from django.conf import settings

    web = os.getpriority(os.PRIO_PROCESS, farm.procs["web"].pid)
    worker = os.getpriority(os.PRIO_PROCESS, farm.procs["worker"].pid)
    assert settings.INLINE_WORKER_NICE == 5
    assert worker == min(19, web + settings.INLINE_WORKER_NICE)


def test_workers_report_their_memory_and_only_staff_see_where_they_run(farm, personas, owner):
    import httpx

    mine = next(w for w in owner.get("/v1/workers").json()["items"]
                if w["name"] == _the_worker().name)
    assert mine["memory"]["kind"] == "rss"
    assert mine["memory"]["bytes"] > 0 and mine["memory"]["baselineBytes"] > 0
    assert mine["pid"] is None and mine["host"] is None
    with httpx.Client(base_url=farm.url, timeout=30,
                      headers={"Authorization": f"Bearer {personas['staff']}"}) as staff:
        seen = next(w for w in staff.get("/v1/workers").json()["items"]
                    if w["name"] == _the_worker().name)
    assert seen["pid"] == farm.procs["worker"].pid
    assert seen["host"]


def test_a_finished_run_says_the_peak_memory_it_took(owner):
    """(Its `estimatedMemoryGb` is null: the farm estimates runs with model files; the go-live
    check, tests/test_farm_check.py, compares a diffusion run's peak with its estimate.)"""
    asset = upload(owner, png(64, 64, (5, 60, 90))).json()
    run_id = owner.post("/v1/runs", json=resize_graph(asset["id"], 640, 480)).json()["runId"]
    run = owner.wait_run(run_id)
    assert run["status"] == "succeeded", run
    assert run["peakMemoryBytes"] > 50 * 2**20  # a worker process with torch imported
    assert run["estimatedMemoryGb"] is None


def test_mine_lists_only_my_runs_not_my_teammates(owner, teammate):
    asset = upload(owner, png(16, 16, (1, 2, 3))).json()
    own = owner.post("/v1/runs", json=resize_graph(asset["id"], 8, 8)).json()["runId"]
    theirs = upload(teammate, png(16, 16, (3, 2, 1))).json()
    other = teammate.post("/v1/runs", json=resize_graph(theirs["id"], 8, 8)).json()["runId"]
    seen = {r["id"] for r in owner.get("/v1/runs", params={"limit": 200}).json()["items"]}
    mine = {r["id"] for r in owner.get("/v1/runs", params={"limit": 200, "mine": "true"})
            .json()["items"]}
    assert {own, other} <= seen
    assert own in mine and other not in mine
