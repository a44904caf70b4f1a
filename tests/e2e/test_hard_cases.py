"""Hard cases on a live farm: a published message the broker lost, a worker that shut down, a
teammate's asset, and a websocket `?after` past the end of the log."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.conftest import delay_graph, png, resize_graph, upload, wait_status

pytestmark = pytest.mark.e2e


def wait_until(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"gave up waiting: {what}"
        time.sleep(0.1)


def test_a_published_run_whose_message_was_lost_is_published_again_and_runs_once(
    farm, owner, db_access
):
    """The dispatcher published the run for a live worker's free slot; the broker then lost the
    message and that worker vanished. Nobody claims the run, so beat's pass publishes it again
    once INLINE_REDISPATCH_SECONDS have passed, and a worker runs it (attempt 1: it never ran)."""
    from django.utils import timezone

    from apps.fleet.models import Worker
    from apps.runs.dispatch import CAPACITY_TTL_S
    from apps.runs.models import Run
    from tests.brokerguard import purge_queue

    farm.stop("worker")  # its shutdown marks it offline: no slot, and no control worker
    ghost = Worker.objects.create(name="ghost@test", incarnation="g", queues=["cpu"], slots=1,
                                  last_heartbeat=timezone.now())
    try:
        # The web reads the fleet's slots at most every CAPACITY_TTL_S: let it see the ghost.
        time.sleep(CAPACITY_TTL_S * 2)
        asset = upload(owner, png(10, 10, (33, 66, 99))).json()["id"]
        run_id = owner.post("/v1/runs", json=resize_graph(asset, 6, 6)).json()["runId"]
        published = wait_until(
            lambda: Run.objects.filter(pk=run_id, dispatched_at__isnull=False).first(), 30,
            "the submit to publish the run")
        assert purge_queue("cpu") >= 1  # the broker loses the message
        Worker.objects.filter(pk=ghost.pk).delete()
    finally:
        Worker.objects.filter(pk=ghost.pk).delete()
        farm.start_worker()

    run = owner.wait_run(run_id, timeout=90)
    assert (run["status"], run["attempts"], len(run["takes"])) == ("succeeded", 1, 1)
    started = Run.objects.get(pk=run_id).started_at
    # Published again only once the first message was stale (a lower bound, not a timing).
    assert (started - published.dispatched_at).total_seconds() >= (
        float(farm.env["INLINE_REDISPATCH_SECONDS"]) - 0.5)


def test_a_worker_that_shut_down_leaves_the_live_list_and_a_silent_one_ages_out(
    farm, owner, db_access
):
    from datetime import timedelta

    from django.conf import settings
    from django.utils import timezone

    from apps.fleet.models import Worker

    def live_names() -> set[str]:
        return {w["name"] for w in owner.get("/v1/workers").json()["items"]}

    name = farm.start_worker(proc="leaving", queues="cpu")
    try:
        assert name in live_names()
        farm.stop("leaving")
        assert Worker.objects.get(name=name).state == "offline"
        assert name not in live_names()

        silent = Worker.objects.create(name="silent@test", incarnation="s", queues=["cpu"],
                                       last_heartbeat=timezone.now())
        assert "silent@test" in live_names()
        horizon = float(farm.env.get("INLINE_WORKER_LOST_SECONDS",
                                     settings.INLINE_WORKER_LOST_SECONDS))
        Worker.objects.filter(pk=silent.pk).update(
            last_heartbeat=timezone.now() - timedelta(seconds=horizon + 1))
        assert "silent@test" not in live_names()
        assert Worker.objects.get(pk=silent.pk).state == "online"  # silent, not shut down
    finally:
        farm.stop("leaving")
        Worker.objects.filter(name="silent@test").delete()


def test_a_teammate_may_use_my_asset_and_an_outsider_may_not(owner, teammate, outsider):
    asset = upload(owner, png(12, 10, (5, 150, 5))).json()
    submitted = teammate.post("/v1/runs", json=resize_graph(asset["id"], 6, 5))
    assert submitted.status_code == 201, submitted.text
    run = teammate.wait_run(submitted.json()["runId"])
    assert run["status"] == "succeeded", run
    assert (run["takes"][0]["width"], run["takes"][0]["height"]) == (6, 5)
    assert teammate.get(f"/v1/assets/{asset['id']}").json()["sha256"] == asset["sha256"]

    refused = outsider.post("/v1/runs", json=resize_graph(asset["id"], 6, 5))
    assert refused.status_code == 422
    error = refused.json()["error"]
    assert (error["code"], error["nodeId"]) == ("asset_not_found", "src")
    assert asset["id"] in error["message"]


def test_after_past_the_last_seq_still_gets_the_run_s_end_and_a_1000(farm, owner, personas):
    asset = upload(owner, png(9, 9, (123, 4, 56))).json()["id"]
    run_id = owner.post("/v1/runs", json=delay_graph(asset, 2)).json()["runId"]
    wait_status(owner, run_id, "running")
    url = farm.url.replace("http://", "ws://", 1) + f"/v1/runs/{run_id}/events?after=100000"
    messages, code = [], None
    with connect(url, additional_headers={"Authorization": f"Bearer {personas['owner']}"},
                 open_timeout=10) as ws:
        try:
            while True:
                messages.append(json.loads(ws.recv(timeout=60)))
        except ConnectionClosed as closed:
            code = closed.rcvd.code if closed.rcvd else None
    snapshot, events = messages[0], messages[1:]
    assert snapshot["type"] == "snapshot" and snapshot["lastSeq"] < 100000
    assert events and events[-1]["type"] == "run_done" and code == 1000
    assert [e["seq"] for e in events] == list(range(snapshot["lastSeq"] + 1,
                                                   events[-1]["seq"] + 1))
