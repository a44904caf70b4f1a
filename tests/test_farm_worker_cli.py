"""`./farm worker` and `./farm web` join a running `./farm up` by its data dir, as ops scale a
farm's sides separately: a second worker (here on a simulated L40S) is one command.

Like tests/test_farm_cli.py, these run the real launcher with no service URLs in the
environment, on a fresh data dir; they need no test database.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.test_farm_cli import (
    FARM,
    _env_without_services,
    _free_port,
    _get,
    _kill_leftovers,
    _processes_of,
    _run_token,
    _start_farm,
    _wait_for_health,
)

pytestmark = pytest.mark.e2e

L40S = {"name": "L40S", "vram_gb": 48}
JOIN_TIMEOUT_S = 120.0


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A fresh folder straight under the system temp dir (see tests/test_farm_cli.py)."""
    path = Path(tempfile.mkdtemp(prefix="farm-worker-test-"))
    yield path
    _kill_leftovers(path)
    shutil.rmtree(path, ignore_errors=True)


def _launch(scratch: Path, name: str, *args: str, env: dict[str, str] | None = None,
            ) -> subprocess.Popen[bytes]:
    command = [str(FARM), *args, "--data-dir", str(scratch / "data"),
               "--models-dir", str(scratch / "models")]
    with (scratch / f"{name}.log").open("wb") as out:
        return subprocess.Popen(command, env={**_env_without_services(), **(env or {})},
                                stdout=out, stderr=subprocess.STDOUT)


def _until(what: str, probe: Callable[[], Any], procs: list[subprocess.Popen[bytes]],
           logs: list[Path]) -> Any:
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    while time.monotonic() < deadline:
        for proc, log in zip(procs, logs, strict=True):
            if proc.poll() is not None:
                pytest.fail(f"{log.name}: exited with {proc.returncode} before {what}:\n"
                            f"{log.read_text()[-4000:]}")
        found = probe()
        if found:
            return found
        time.sleep(0.5)
    pytest.fail(f"never saw {what}:\n" + "\n".join(log.read_text()[-3000:] for log in logs))


def _json(port: int, path: str, token: str | None = None) -> tuple[int, Any]:
    status, body = _get(f"http://127.0.0.1:{port}{path}", token)
    try:
        return status, json.loads(body or b"null")
    except ValueError:
        return status, None


def _stop(proc: subprocess.Popen[bytes], log: Path) -> None:
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 0, log.read_text()[-4000:]


def test_a_worker_and_a_web_join_a_running_farm_by_its_data_dir(scratch: Path) -> None:
    data_dir = scratch / "data"
    farm, port = _start_farm(scratch)
    procs: list[subprocess.Popen[bytes]] = [farm]
    try:
        _wait_for_health(port, farm, scratch / "up.log")
        ops = _run_token(data_dir, "ops", "--staff")[-1]
        alice = _run_token(data_dir, "alice")[-1]

        worker = _launch(scratch, "worker", "worker", "--pool", "sim-l40s", "--slots", "2",
                         env={"INLINE_GPU_DESCRIPTION": json.dumps(L40S)})
        procs.append(worker)
        logs = [scratch / "up.log", scratch / "worker.log"]

        def joined() -> dict[str, Any] | None:
            items = _json(port, "/v1/workers", alice)[1]["items"]
            return next((w for w in items if w.get("pool") == "sim-l40s"), None)

        mine = _until("the worker in /v1/workers", joined, procs, logs)
        assert mine["name"].startswith("sim-l40s-gpu0@")
        assert set(mine["queues"]) == {"gpu.48g", "cpu"}
        assert (mine["device"]["device_name"], mine["device"]["vram_gb"]) == ("L40S", 48.0)
        assert mine["device"]["simulated"] is True and mine["device"]["gpu"]["totalGb"] == 48.0
        assert "worker1@" in json.dumps(_json(port, "/v1/workers", alice)[1])  # up's own worker

        # Ops' views: the health detail and the metrics count the new worker and its queue.
        assert _json(port, "/v1/health?detail=1")[0] == 401
        assert _json(port, "/v1/health?detail=1", alice)[0] == 403
        status, health = _json(port, "/v1/health?detail=1", ops)
        assert status == 200 and health["queues"]["gpu.48g"]["workers"] == 1, health
        assert health["queues"]["cpu"]["workers"] == 2, health
        assert "queues" not in _json(port, "/v1/health")[1]  # the public one stays small

        status, text = _get(f"http://127.0.0.1:{port}/metrics", ops)
        assert status == 200
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for family in text_string_to_metric_families(text.decode())
                   for s in family.samples}
        gpu = (("gpu", "L40S"), ("pool", "sim-l40s"), ("worker", mine["name"]))
        assert samples[("inline_worker_gpu_memory_total_bytes", gpu)] == 48 * 2**30
        assert samples[("inline_workers", (("pool", "sim-l40s"), ("state", "online")))] == 1
        assert samples[("inline_worker_slots", (("pool", "sim-l40s"),))] == 2

        # A second web on another port serves the same farm.
        web_port = _free_port()
        web = _launch(scratch, "web", "web", "--port", str(web_port))
        procs.append(web)
        logs.append(scratch / "web.log")
        health = _until("the second web's health", lambda: _json(web_port, "/v1/health")[1],
                        procs, logs)
        assert health["status"] == "ok" and health["workers"] == 2, health
        assert _json(web_port, "/v1/workers", alice)[0] == 200

        _stop(web, scratch / "web.log")
        _stop(worker, scratch / "worker.log")
        assert joined() is None  # a clean stop marks it offline at once
        _stop(farm, scratch / "up.log")
        assert _processes_of(data_dir) == []
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()


def test_a_worker_with_no_farm_to_join_says_what_it_needs(scratch: Path) -> None:
    result = subprocess.run([str(FARM), "worker", "--data-dir", str(scratch / "data")],
                            env=_env_without_services(), capture_output=True, text=True,
                            timeout=60)
    assert result.returncode != 0
    assert "set DATABASE_URL and BROKER_URL" in result.stderr
    assert "--data-dir of a running ./farm up" in result.stderr
