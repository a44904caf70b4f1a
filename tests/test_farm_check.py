"""`./farm check`, the go-live checklist, against a live farm: it passes on a healthy farm and
fails, naming the check, on a worker that renders other pixels and on a user without limits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import smoke_stack_reported

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parent.parent


def check(farm: Any, token: str, *args: str) -> tuple[int, dict[str, dict[str, Any]]]:
    out = subprocess.run(
        [sys.executable, "-m", "inline_farm.cli", "check", "--json", "--size", "64x64",
         "--steps", "3", "--url", farm.url, "--token", token, *args],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert out.stdout.strip(), out.stderr
    return out.returncode, {c["name"]: c for c in json.loads(out.stdout.strip().splitlines()[-1])}


@pytest.fixture
def stack(farm, personas, data_dirs):
    return smoke_stack_reported(farm, personas["owner"], data_dirs["models"])


@pytest.fixture
def wan_stack(farm, owner, data_dirs) -> dict[str, str]:
    """Wan's smoke stack beside it: T2V and I2V (36-channel) transformers, a video family."""
    import time

    from workers.models.wan.tiny import write_smoke_stack

    names = write_smoke_stack(data_dirs["models"])
    deadline = time.monotonic() + 30
    while not set(names.values()) <= {f["name"] for f in owner.get("/v1/models/files").json()["files"]}:
        assert time.monotonic() < deadline, "no worker reported the Wan smoke stack"
        time.sleep(0.2)
    return names


@pytest.fixture
def ltx2_stack(farm, owner, data_dirs) -> str:
    """LTX-2's smoke checkpoint (an LTX2Pipeline folder): the memory check renders it a clip."""
    import time

    from workers.models.ltx2.tiny import write_tiny_stack

    name = write_tiny_stack(data_dirs["models"])["checkpoint"]
    deadline = time.monotonic() + 30
    while name not in {f["name"] for f in owner.get("/v1/models/files").json()["files"]}:
        assert time.monotonic() < deadline, "no worker reported the LTX-2 smoke stack"
        time.sleep(0.2)
    return name


@pytest.fixture
def minimaxh3_stack(farm, owner, data_dirs) -> str:
    """MiniMax-H3's smoke checkpoint (a diffusers folder): the memory check renders it a clip."""
    import time

    from workers.models.minimaxh3.plugin import write_tiny_stack

    name = write_tiny_stack(data_dirs["models"])["checkpoint"]
    deadline = time.monotonic() + 30
    while name not in {f["name"] for f in owner.get("/v1/models/files").json()["files"]}:
        assert time.monotonic() < deadline, "no worker reported the MiniMax-H3 smoke stack"
        time.sleep(0.2)
    return name


def test_the_checklist_passes_on_a_healthy_farm(farm, personas, stack, wan_stack, ltx2_stack,
                                                minimaxh3_stack):
    code, results = check(farm, personas["owner"], "--model", stack["model"])
    assert code == 0, [r for r in results.values() if r["ok"] is not True]
    for name in ("reproducible", "isolated", "memory", "cancel", "overload"):
        assert results[name]["ok"] is True, results[name]
    assert "zimage: " in results["memory"]["figures"]
    assert "wan: " in results["memory"]["figures"]  # a clip of its T2V model, not the I2V one
    assert "ltx2: " in results["memory"]["figures"]  # a clip with sound from its checkpoint
    assert "minimaxh3: " in results["memory"]["figures"]  # the same, of its own nodes
    assert "(rss above start) ≤ estimate" in results["memory"]["figures"]
    assert "memory" in results["cancel"]["figures"] and "before" in results["cancel"]["figures"]
    assert "429 after 100 runs in flight" in results["overload"]["figures"]
    assert "failover" not in results  # only with --destructive


def test_a_user_without_an_in_flight_limit_fails_the_overload_check(farm, stack, db_access):
    from apps.accounts.models import UserLimits
    from apps.accounts.services import token_create, user_get_or_create

    user = user_get_or_create(username="unlimited")
    UserLimits.objects.update_or_create(user=user, defaults={"max_inflight_runs": 100_000})
    token = token_create(user=user, name="test")[1]
    code, results = check(farm, token, "--model", stack["model"], "--burst", "120",
                          "--only", "overload")
    assert code == 1
    assert list(results) == ["overload"]  # --only
    assert results["overload"]["ok"] is False
    assert "no 429 after 120 runs" in results["overload"]["figures"]


def test_a_worker_whose_files_render_other_pixels_fails_the_reproducibility_check(
        farm, personas, data_dirs, tmp_path):
    """A second worker holds files of the same names with other weights (two pools given
    different files under one name): one seed renders two images."""
    from workers.models.zimage.tiny import write_smoke_stack

    names = smoke_stack_reported(farm, personas["owner"], data_dirs["models"], name="repro")
    other = tmp_path / "models"
    assert write_smoke_stack(other, name="repro", seed=99) == names
    worker = farm.start_worker(proc="worker-other", env={"INLINE_MODELS_DIR": str(other)})
    try:
        code, results = check(farm, personas["owner"], "--model", names["model"],
                              "--only", "reproducible")
    finally:
        farm.stop("worker-other")
    assert code == 1, results
    assert results["reproducible"]["ok"] is False
    assert "different images of one seed" in results["reproducible"]["figures"]
    assert worker in results["reproducible"]["figures"]


def test_a_worker_killed_mid_run_fails_over_and_the_run_finishes_once(farm, personas, stack):
    """--destructive SIGKILLs the worker rendering the run (a staff token sees its pid); the
    run finishes on the other worker, once."""
    farm.start_worker(proc="worker-spare")
    try:
        code, results = check(farm, personas["staff"], "--model", stack["model"], "--destructive",
                              "--only", "failover")
    finally:
        farm.stop("worker-spare")
        if farm.procs["worker"].poll() is not None:  # the check killed the session's worker
            farm.procs.pop("worker")
            farm.start_worker()
    assert code == 0, results
    assert list(results) == ["failover"]
    assert results["failover"]["ok"] is True, results["failover"]
    assert "succeeded" in results["failover"]["figures"]
    assert "1 take(s)" in results["failover"]["figures"]


def test_without_a_staff_token_the_failover_check_says_it_cannot_run(farm, personas, stack):
    code, results = check(farm, personas["owner"], "--model", stack["model"], "--destructive",
                          "--only", "failover")
    assert code == 0, results
    assert results["failover"]["ok"] is None
    assert "staff token" in results["failover"]["figures"]


def test_a_check_its_flag_was_not_given_for_is_refused_by_name(farm, personas):
    out = subprocess.run(
        [sys.executable, "-m", "inline_farm.cli", "check", "--url", farm.url, "--token",
         personas["owner"], "--only", "cuda,failover"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode != 0
    assert "--only: cuda needs --gpu, failover needs --destructive" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
