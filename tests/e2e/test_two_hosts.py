"""Two GPU hosts simulated on this machine (issue 13): runs land only where they fit and the
files are; a drained pool's queued runs move to the other pool when they fit there, else they
wait with the reason in their `waiting` field."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_status

pytestmark = pytest.mark.e2e


def _host_env(models: Path, card: str, vram: int, pool: str) -> dict[str, str]:
    return {"INLINE_PROFILE": "auto", "INLINE_MODELS_DIR": str(models), "INLINE_POOL": pool,
            "INLINE_GPU_DESCRIPTION": json.dumps({"name": card, "vram_gb": vram})}


@pytest.fixture(scope="module")
def hosts(farm: Any, tmp_path_factory: pytest.TempPathFactory, django_db_blocker: Any) -> Any:
    """Host A: an RTX 4090 (24 GB) holding `shared`; host B: an L40S (48 GB) holding `shared`
    and `onlyb`. Each is a worker process with its own models dir and pool."""
    from workers.models.zimage.tiny import write_smoke_stack

    a_dir, b_dir = tmp_path_factory.mktemp("host-a"), tmp_path_factory.mktemp("host-b")
    stacks = {"shared": write_smoke_stack(a_dir, name="shared")}
    write_smoke_stack(b_dir, name="shared")
    stacks["onlyb"] = write_smoke_stack(b_dir, name="onlyb")
    with django_db_blocker.unblock():
        names = {
            "a": farm.start_worker(queues="gpu.24g", proc="host-a", slots=2,
                                   env=_host_env(a_dir, "RTX 4090", 24, "sim-4090")),
            "b": farm.start_worker(queues="gpu.48g", proc="host-b", slots=2,
                                   env=_host_env(b_dir, "L40S", 48, "sim-l40s")),
        }
    yield {"stacks": stacks, "workers": names}
    farm.stop("host-a")
    farm.stop("host-b")


def _turbo(stack: dict[str, str], side: int, seed: int = 1) -> dict[str, Any]:
    return {"graph": {"nodes": {
        "gen": {"type": "zimage/turbo", "params": {
            "prompt": "two hosts", "width": side, "height": side, "steps": 1, "seed": seed,
            "model": stack["model"], "vae": stack["vae"], "text_encoder": stack["text_encoder"]}},
        "out": {"type": "image/save", "inputs": {"image": {"node": "gen", "port": "image"}}},
    }}, "target": "out"}


def _worker(name: str) -> Any:
    from apps.fleet.models import Worker

    return Worker.objects.get(name=name)


def test_runs_land_only_where_they_fit_and_the_files_are(owner, hosts, db_access):
    from apps.runs.models import Run

    shared, onlyb = hosts["stacks"]["shared"], hosts["stacks"]["onlyb"]
    small = owner.post("/v1/runs", json=_turbo(shared, 64)).json()
    assert owner.get(f"/v1/runs/{small['runId']}").json()["queue"] == "gpu.24g"  # the cheaper
    only_b = owner.post("/v1/runs", json=_turbo(onlyb, 64)).json()
    assert owner.get(f"/v1/runs/{only_b['runId']}").json()["queue"] == "gpu.48g"  # its files
    for run_id, worker in ((small["runId"], hosts["workers"]["a"]),
                           (only_b["runId"], hosts["workers"]["b"])):
        assert owner.wait_run(run_id, timeout=120)["status"] == "succeeded"
        assert worker in {e["worker"].split("#")[0] for e in Run.objects.get(pk=run_id).events
                          .filter(type="status").values_list("payload", flat=True)
                          if "worker" in e}

    too_big = owner.post("/v1/runs", json=_turbo(shared, 4096))
    assert too_big.status_code == 422 and too_big.json()["error"]["code"] == "run_cannot_fit"
    assert "at most 48 GB" in too_big.json()["error"]["message"]


def test_a_drained_pool_s_queued_runs_move_when_they_fit_and_else_wait_saying_why(
    owner, hosts, db_access
):
    from apps.fleet.services import worker_drain, worker_resume
    from apps.runs.models import Run

    a, b = hosts["workers"]["a"], hosts["workers"]["b"]
    shared = hosts["stacks"]["shared"]
    worker_drain(worker=_worker(a))
    worker_drain(worker=_worker(b))
    try:
        big = owner.post("/v1/runs", json=_turbo(shared, 2880)).json()["runId"]  # ~26 GB: B only
        fits_a = owner.post("/v1/runs", json=_turbo(shared, 64, seed=2)).json()["runId"]
        # As if it had been routed to B's pool before A had room: now B's pool drains.
        Run.objects.filter(pk=fits_a, status="queued").update(queue="gpu.48g", dispatched_at=None)
        worker_resume(worker=_worker(a))

        deadline = time.monotonic() + 30
        while Run.objects.get(pk=fits_a).queue != "gpu.24g" and time.monotonic() < deadline:
            time.sleep(0.2)  # beat's pass moves it
        assert owner.wait_run(fits_a, timeout=120)["status"] == "succeeded"
        waiting = wait_status(owner, big, "queued")
        assert waiting["queue"] == "gpu.48g"
        assert "every worker serving gpu.48g is draining" in waiting["waiting"]
    finally:
        worker_resume(worker=_worker(a))
        worker_resume(worker=_worker(b))
        owner.delete(f"/v1/runs/{big}")
