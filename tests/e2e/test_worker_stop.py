"""A worker stopped with SIGTERM takes no new run and hands its runs back after a grace period."""

from __future__ import annotations

import signal
import time

import pytest

from tests.conftest import delay_graph, png, upload, wait_status

pytestmark = pytest.mark.e2e


def test_a_stopping_worker_hands_its_run_back_at_once_and_another_finishes_it(
    farm, owner, db_access
):
    from apps.runs.models import RunEvent
    from apps.takes.models import Take

    farm.stop("worker")
    farm.start_worker(proc="stopping", env={"INLINE_WORKER_GRACE_SECONDS": "1"})
    try:
        asset = upload(owner, png(8, 8, (90, 9, 9))).json()["id"]
        # long enough that a SIGTERM sent late on a loaded machine still lands mid-run
        run_id = owner.post("/v1/runs", json=delay_graph(asset, 15)).json()["runId"]
        wait_status(owner, run_id, "running")
        stopped_at = time.monotonic()
        farm.stop("stopping", sig=signal.SIGTERM)  # returns once the process has exited
        back = wait_status(owner, run_id, "queued", timeout=15)
        print(f"SIGTERM → run back in the queue after {time.monotonic() - stopped_at:.1f} s "
              f"(grace 1 s; the lease is {farm.env['INLINE_LEASE_SECONDS']} s)")
        assert back["attempts"] == 1
        reasons = [e["reason"] for e in RunEvent.objects.filter(run_id=run_id, type="status")
                   .values_list("payload", flat=True) if e.get("status") == "queued"]
        assert len(reasons) == 1 and "is stopping; handed back" in reasons[0]
    finally:
        farm.start_worker()
    run = owner.wait_run(run_id, timeout=60)
    assert (run["status"], run["attempts"]) == ("succeeded", 2)
    assert Take.objects.filter(run_id=run_id).count() == 1
