"""A real farm for tests: uvicorn (ASGI) + a Celery worker + beat, as subprocesses, on the
pytest-django test database and the configured broker. Nothing is mocked."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from inline_farm.cli import uvicorn_argv

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def database_url(db: dict[str, Any]) -> str:
    """A DATABASE_URL for a Django DATABASES entry (socket hosts go in ?host=)."""
    user = quote(db.get("USER") or "")
    password = quote(db.get("PASSWORD") or "")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host, port = db.get("HOST") or "", db.get("PORT") or ""
    if host.startswith("/"):
        return f"postgresql://{auth}/{db['NAME']}?host={quote(host)}"
    return f"postgresql://{auth}{host}{':' + port if port else ''}/{db['NAME']}"


@dataclass
class LiveFarm:
    """The processes of one farm and how to reach it."""

    env: dict[str, str]
    logs: Path
    port: int = field(default_factory=free_port)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    worker_count: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _spawn(self, name: str, args: list[str], extra_env: dict[str, str] | None = None) -> None:
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 — lives as long as the process
        self.procs[name] = subprocess.Popen(
            args, cwd=REPO, env={**self.env, **(extra_env or {})}, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )

    def start_web(self) -> None:
        self._spawn("web", uvicorn_argv("127.0.0.1", self.port, "--log-level", "warning"))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/v1/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            self._check_alive("web")
            time.sleep(0.2)
        raise RuntimeError(f"web did not come up; see {self.logs / 'web.log'}")

    def start_worker(self, queues: str = "cpu,control", wait: bool = True, slots: int = 4,
                     proc: str = "worker", env: dict[str, str] | None = None) -> str:
        self.worker_count += 1
        name = f"w{self.worker_count}@test"
        self._spawn(proc, [sys.executable, "-m", "celery", "-A", "inline_farm", "worker",
                           f"--concurrency={slots}", "-Q", queues, "-n", name,
                           "--without-mingle", "--without-gossip", "--loglevel=INFO"], env)
        if wait:
            self.wait_for_worker(name)
        return name

    def wait_for_worker(self, name: str, timeout: float = 90) -> None:
        from apps.fleet.selectors import workers_live

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if workers_live().filter(name=name).exists():
                return
            for proc in self.procs:
                if proc.startswith("worker"):
                    self._check_alive(proc)
            time.sleep(0.2)
        raise RuntimeError(f"worker {name} never heartbeated; see {self.logs / 'worker.log'}")

    def start_beat(self) -> None:
        self._spawn("beat", [sys.executable, "-m", "celery", "-A", "inline_farm", "beat",
                             "-s", str(self.logs / "celerybeat-schedule"), "--loglevel=WARNING"])

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)

    def _check_alive(self, name: str) -> None:
        proc = self.procs.get(name)
        if proc is not None and proc.poll() is not None:
            tail = (self.logs / f"{name}.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{tail}")


class Client(httpx.Client):
    """An API client holding one persona's token."""

    def wait_run(self, run_id: str, timeout: float = 60) -> dict[str, Any]:
        """Poll until the run is terminal; return its final state."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            run = self.get(f"/v1/runs/{run_id}").json()
            if run["status"] in ("succeeded", "failed", "cancelled"):
                return run
            time.sleep(0.1)
        raise AssertionError(f"run {run_id} did not finish in {timeout}s: {run}")
