"""Runs survive restarts and lost workers; a run executes once however often it is delivered."""

from __future__ import annotations

import signal

import pytest

from tests.conftest import delay_graph, png, resize_graph, upload, wait_status

pytestmark = pytest.mark.e2e


def _events(run_id):
    from apps.runs.models import RunEvent

    return list(RunEvent.objects.filter(run_id=run_id).order_by("seq").values("type", "payload"))


def test_a_worker_killed_mid_run_is_replaced_and_the_run_finishes_once(farm, owner, db_access):
    from apps.takes.models import Take

    asset = upload(owner, png(16, 16, (70, 70, 0))).json()
    run_id = owner.post("/v1/runs", json=delay_graph(asset["id"], 4)).json()["runId"]
    wait_status(owner, run_id, "running")
    farm.stop("worker", sig=signal.SIGKILL)  # no goodbye: the lease just stops being renewed
    farm.start_worker()

    run = owner.wait_run(run_id, timeout=90)
    assert run["status"] == "succeeded", run
    assert run["attempts"] == 2
    assert Take.objects.filter(run_id=run_id).count() == 1
    requeued = [e for e in _events(run_id) if e["type"] == "status"
                and e["payload"]["status"] == "queued"]
    assert len(requeued) == 1 and "stopped heartbeating" in requeued[0]["payload"]["reason"]


def test_state_events_and_takes_survive_a_restart_of_server_and_worker(farm, owner, db_access):
    asset = upload(owner, png(16, 16, (0, 70, 70))).json()
    run_id = owner.post("/v1/runs", json=resize_graph(asset["id"], 8, 8)).json()["runId"]
    before = owner.wait_run(run_id)
    take_bytes = owner.get(f"/v1/takes/{before['takes'][0]['id']}/bytes").content
    events = _events(run_id)

    farm.stop("web")
    farm.stop("worker")
    farm.start_web()
    farm.start_worker()

    after = owner.get(f"/v1/runs/{run_id}").json()
    assert after == before
    assert _events(run_id) == events
    assert owner.get(f"/v1/takes/{before['takes'][0]['id']}/bytes").content == take_bytes


def test_runs_wait_while_no_worker_is_up_and_cancel_works_while_queued(farm, owner, db_access):
    from inline_farm.celery import app

    farm.stop("worker")
    asset = upload(owner, png(16, 16, (9, 90, 9))).json()
    waiting = owner.post("/v1/runs", json=resize_graph(asset["id"], 8, 8)).json()["runId"]
    doomed = owner.post("/v1/runs", json=resize_graph(asset["id"], 9, 9)).json()["runId"]
    # Two extra deliveries of the same id: a duplicate must never execute twice.
    for _ in range(2):
        app.send_task("workers.tasks.execute_run", args=[waiting], queue="cpu")
    queued = owner.get(f"/v1/runs/{waiting}").json()
    assert queued["status"] == "queued"
    assert "no live worker serves cpu" in queued["waiting"]  # the run says why it waits
    cancelled = owner.delete(f"/v1/runs/{doomed}")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"

    farm.start_worker()
    run = owner.wait_run(waiting)
    assert (run["status"], run["attempts"], len(run["takes"])) == ("succeeded", 1, 1)
    running = [e for e in _events(waiting) if e["type"] == "status"]
    assert len(running) == 1
    assert owner.get(f"/v1/runs/{doomed}").json()["status"] == "cancelled"
    assert owner.get(f"/v1/runs/{doomed}").json()["takes"] == []


def test_cancelling_a_running_run_stops_it_and_frees_the_worker(owner, db_access):
    import time

    from apps.fleet.models import Worker
    from apps.runs.models import Run

    asset = upload(owner, png(16, 16, (200, 0, 200))).json()
    # 10 minutes of delay: a slot still holding it long after the cancel was not freed.
    run_id = owner.post("/v1/runs", json=delay_graph(asset["id"], 600)).json()["runId"]
    wait_status(owner, run_id, "running")
    holder = Run.objects.get(pk=run_id).lease_worker.split("#", 1)[0]
    deadline = time.monotonic() + 60  # the worker's heartbeat reports the runs it holds
    while run_id not in Worker.objects.get(name=holder).running:
        assert time.monotonic() < deadline, "the worker never reported holding the run"
        time.sleep(0.2)
    response = owner.delete(f"/v1/runs/{run_id}")
    assert response.json()["status"] == "cancelled"
    deadline = time.monotonic() + 120
    while run_id in Worker.objects.get(name=holder).running:
        assert time.monotonic() < deadline, "the worker still holds the cancelled run"
        time.sleep(0.2)

    nxt = owner.wait_run(owner.post("/v1/runs", json=resize_graph(asset["id"], 8, 8))
                         .json()["runId"], timeout=60)
    assert nxt["status"] == "succeeded"
    run = Run.objects.get(pk=run_id)
    assert run.status == "cancelled" and not run.takes.exists()
    refused = owner.delete(f"/v1/runs/{nxt['id']}")
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "run_finished" and "succeeded" in refused.text
    assert owner.get(f"/v1/runs/{nxt['id']}").json()["status"] == "succeeded"


def test_a_node_that_fails_fails_the_run_naming_the_node(owner):
    asset = upload(owner, png(16, 16)).json()
    graph = resize_graph(asset["id"])
    graph["graph"]["nodes"]["big"] = {"type": "image/crop",
                                      "params": {"x": 10, "y": 10, "width": 50, "height": 50},
                                      "inputs": {"image": {"node": "src", "port": "image"}}}
    run = owner.wait_run(owner.post("/v1/runs", json=graph).json()["runId"])
    assert run["status"] == "failed"
    assert run["error"]["nodeId"] == "big" and run["error"]["code"] == "node_failed"
    assert "does not fit" in run["error"]["message"]


def test_a_run_waiting_on_a_queue_nobody_serves_is_rerouted(farm, owner, db_access):
    from apps.runs.models import Run
    from tests.brokerguard import purge_queue

    farm.stop("worker")
    asset = upload(owner, png(16, 16, (3, 3, 3))).json()
    run_id = owner.post("/v1/runs", json=delay_graph(asset["id"], 0.2)).json()["runId"]
    # As if it had been routed to a GPU class that has since left the fleet:
    assert Run.objects.filter(pk=run_id, status="queued").update(queue="gpu.12g") == 1
    purge_queue("cpu")  # the submit-time message is gone with the GPUs
    farm.start_worker()  # serves cpu + control; beat's dispatcher pass reroutes the run
    run = owner.wait_run(run_id)
    assert run["status"] == "succeeded" and run["queue"] == "cpu"
