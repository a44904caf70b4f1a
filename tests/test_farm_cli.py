"""`./farm up` runs the whole farm on embedded PostgreSQL + Redis, and Ctrl-C takes all of it down.

These tests run the real launcher as a user would, with DATABASE_URL / BROKER_URL /
CHANNEL_REDIS_URL removed from the environment, in a fresh data dir. They need no test database.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parent.parent
FARM = REPO_ROOT / "farm"
START_TIMEOUT_S = 120.0
TOKEN = re.compile(r"^\S{20,}$")


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A fresh folder straight under the system temp dir. Not pytest's tmp_path: as root the
    embedded PostgreSQL runs as the `pgserver` user, and every pytest session that starts resets
    /tmp/pytest-of-root to 0700, locking that user out of a data dir beneath it."""
    path = Path(tempfile.mkdtemp(prefix="farm-cli-test-"))
    yield path
    _kill_leftovers(path)
    shutil.rmtree(path, ignore_errors=True)


def _env_without_services() -> dict[str, str]:
    env = dict(os.environ)
    for key in ("DATABASE_URL", "BROKER_URL", "CHANNEL_REDIS_URL", "INLINE_DATA_DIR"):
        env.pop(key, None)
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str, token: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
    except (urllib.error.URLError, OSError):
        return 0, b""


def _processes_of(data_dir: Path) -> list[psutil.Process]:
    """Every process that belongs to this data dir: postgres (-D …), redis (cwd), web/workers/beat
    (INLINE_DATA_DIR in their environment)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid == os.getpid():
                continue
            in_cmdline = any(str(data_dir) in part for part in proc.cmdline())
            in_cwd = proc.cwd().startswith(str(data_dir))
            in_env = proc.environ().get("INLINE_DATA_DIR") == str(data_dir)
        except (psutil.Error, OSError):
            continue
        if in_cmdline or in_cwd or in_env:
            found.append(proc)
    return found


def _kill_leftovers(data_dir: Path) -> None:
    for proc in _processes_of(data_dir):
        with contextlib.suppress(psutil.Error):
            proc.kill()


def _run_token(data_dir: Path, username: str, *extra: str) -> list[str]:
    result = subprocess.run(
        [str(FARM), "token", username, "--data-dir", str(data_dir), *extra],
        env=_env_without_services(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.strip().splitlines()


def _wait_for_health(port: int, farm: subprocess.Popen[bytes], log: Path) -> None:
    """Until `up` says it is ready: health answers 200 and the banner is printed (which `up`
    does only once a worker has reported in)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if farm.poll() is not None:
            pytest.fail(f"./farm up exited with {farm.returncode}:\n{log.read_text()[-4000:]}")
        if (_get(f"http://127.0.0.1:{port}/v1/health")[0] == 200
                and "Inline Farm is up." in log.read_text(errors="replace")):
            return
        time.sleep(0.5)
    pytest.fail(f"./farm up never said it was up:\n{log.read_text()[-4000:]}")


def _start_farm(scratch: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = _free_port()
    command = [str(FARM), "up", "--port", str(port), "--data-dir", str(scratch / "data")]
    command += ["--models-dir", str(scratch / "models")]
    with (scratch / "up.log").open("wb") as out:
        farm = subprocess.Popen(command, env=_env_without_services(), stdout=out, stderr=subprocess.STDOUT)
    return farm, port


def test_farm_up_serves_the_api_and_ctrl_c_stops_every_process(scratch: Path) -> None:
    data_dir, log = scratch / "data", scratch / "up.log"
    farm, port = _start_farm(scratch)
    try:
        _wait_for_health(port, farm, log)
        names = {p.name() for p in _processes_of(data_dir) if p.is_running()}
        assert "postgres" in names, names
        assert any(name.startswith("redis-server") for name in names), names

        token = _run_token(data_dir, "alice")[-1]
        assert TOKEN.match(token)
        assert _get(f"http://127.0.0.1:{port}/v1/runs", token)[0] == 200
        assert _get(f"http://127.0.0.1:{port}/v1/runs")[0] == 401

        farm.send_signal(signal.SIGINT)
        assert farm.wait(timeout=60) == 0, log.read_text()[-4000:]
        assert _processes_of(data_dir) == []
        assert "Inline Farm is up." in log.read_text()
    finally:
        if farm.poll() is None:
            farm.kill()


def _workers(farm: subprocess.Popen[bytes]) -> list[psutil.Process]:
    found = []
    for child in psutil.Process(farm.pid).children():
        with contextlib.suppress(psutil.Error):  # a child that just died is a zombie
            if "worker1@%h" in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
    return found


def test_when_a_worker_dies_farm_up_restarts_it_and_keeps_serving(scratch: Path) -> None:
    data_dir, log = scratch / "data", scratch / "up.log"
    farm, port = _start_farm(scratch)
    try:
        _wait_for_health(port, farm, log)
        token = _run_token(data_dir, "alice")[-1]
        (worker,) = _workers(farm)
        worker.kill()

        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert farm.poll() is None, log.read_text()[-4000:]
            assert _get(f"http://127.0.0.1:{port}/v1/runs", token)[0] == 200  # still serving
            restarted = [w for w in _workers(farm) if w.pid != worker.pid]
            if restarted and "worker1@" in _get(f"http://127.0.0.1:{port}/v1/workers", token)[1].decode():
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"worker1 never came back:\n{log.read_text()[-4000:]}")
        assert "worker1 exited with code -9; restarting it" in log.read_text()

        farm.send_signal(signal.SIGINT)
        assert farm.wait(timeout=60) == 0, log.read_text()[-4000:]
        assert _processes_of(data_dir) == []
    finally:
        if farm.poll() is None:
            farm.kill()


def test_farm_token_prints_the_token_last_and_leaves_nothing_running(scratch: Path) -> None:
    data_dir = scratch / "data"

    first = _run_token(data_dir, "alice")
    second = _run_token(data_dir, "bob", "--staff")

    assert TOKEN.match(first[-1]) and TOKEN.match(second[-1])
    assert first[-1] != second[-1]
    assert _processes_of(data_dir) == []  # the embedded PostgreSQL it started is stopped again


def test_the_web_keeps_no_access_log_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """A poll every few ms would be a log line each: uvicorn's access log is opt-in."""
    from inline_farm.cli import uvicorn_argv

    monkeypatch.delenv("INLINE_ACCESS_LOG", raising=False)
    assert "--no-access-log" in uvicorn_argv("127.0.0.1", 8188)
    monkeypatch.setenv("INLINE_ACCESS_LOG", "1")
    assert "--no-access-log" not in uvicorn_argv("127.0.0.1", 8188)
