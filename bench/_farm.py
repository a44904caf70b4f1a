"""Bring up a throwaway farm for a benchmark: its own database, data dir, web + worker processes.

Uses the configured PostgreSQL server (DATABASE_URL) and broker (BROKER_URL), but a database
and queues of its own, dropped at the end, so a benchmark never touches a real farm's runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
from websockets.sync.client import connect

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.livefarm import LiveFarm, database_url  # noqa: E402 — after the path is set


@contextmanager
def bench_farm(
    *, workers: int = 1, extra_env: dict[str, str] | None = None, beat: bool = False,
    slots: int = 4,
) -> Iterator[Any]:
    """Yield (farm, token, models_dir) for a fresh farm; everything is torn down afterwards (its
    directory too, but for the logs of a benchmark that failed)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inline_farm.settings")
    import django
    from django.conf import settings

    django.setup()
    admin_db = dict(settings.DATABASES["default"])
    name = f"inline_bench_{uuid.uuid4().hex[:8]}"
    _create_db(admin_db, name)
    root = Path(tempfile.mkdtemp(prefix="inline-bench-"))
    dirs = {k: root / k for k in ("data", "models", "logs")}
    for d in dirs.values():
        d.mkdir()
    env = {**os.environ, "DATABASE_URL": database_url({**admin_db, "NAME": name}),
           "INLINE_DATA_DIR": str(dirs["data"]), "INLINE_MODELS_DIR": str(dirs["models"]),
           "INLINE_PROFILE": "cpu", **(extra_env or {})}
    farm = LiveFarm(env=env, logs=dirs["logs"])
    finished = False
    try:
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=REPO, env=env,
                       check=True)
        token = subprocess.run([sys.executable, "manage.py", "farm_token", "bench"], cwd=REPO,
                               env=env, check=True, capture_output=True, text=True
                               ).stdout.strip().splitlines()[-1]
        farm.start_web()
        for i in range(workers):
            farm.start_worker(wait=False, slots=slots, proc=f"worker{i + 1}")
        if beat:
            farm.start_beat()
        yield farm, token, dirs["models"]
        finished = True
    finally:
        farm.stop_all()
        _drop_db(admin_db, name)
        if finished:  # ~7 MB a farm (the tiny model stack, takes): a bench run leaves nothing
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"the bench farm's logs are kept in {dirs['logs']}", file=sys.stderr)


def _connect(db: dict[str, Any]) -> psycopg.Connection:
    return psycopg.connect(dbname="postgres", user=db["USER"] or None,
                           password=db["PASSWORD"] or None, host=db["HOST"] or None,
                           port=db["PORT"] or None, autocommit=True)


def _create_db(db: dict[str, Any], name: str) -> None:
    with _connect(db) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')


def _drop_db(db: dict[str, Any], name: str) -> None:
    with _connect(db) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def each_user(tokens: list[str], user: Any) -> None:
    """Run `user(token, k)` for every token at once, one thread each, until all are done."""
    all_at_once(lambda k_token: user(k_token[1], k_token[0]), list(enumerate(tokens)))


def all_at_once(work: Any, items: list[Any]) -> float:
    """`work(item)` for every item at once, one thread each; seconds until the last is done."""
    import threading
    import time

    threads = [threading.Thread(target=work, args=(item,)) for item in items]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - start


def connected_clients(url: str, tokens: list[str]) -> dict[str, httpx.Client]:
    """One client per token, each with its connection open, made before a burst's clock starts.

    Making an httpx.Client costs ~18 ms of CPU (it builds a TLS context even for http://): eight
    of them made inside the measured window, as the bursts did until 2026-12-02, were ~145 ms of
    the client's own setup in a window of ~700 ms, on the same 2 cores as the farm. A client's
    setup is not the farm's cost; the farm's part starts at the first submit."""
    clients = {t: httpx.Client(base_url=url, headers={"Authorization": f"Bearer {t}"}, timeout=60)
               for t in tokens}
    for client in clients.values():
        client.get("/v1/health").raise_for_status()
    return clients


def per_second(stamps: list[float], start: float) -> float:
    """How many events `stamps` (time.time()) holds per second since `start`."""
    return len(stamps) / (max(stamps) - start)


def wait_for_model(client: Any, model: str) -> None:
    """Until a worker reports `model` among zimage/turbo's choices (at most 2 minutes)."""
    import time

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        params = client.get("/v1/models/zimage/turbo").json()["params"]
        if model in next(p for p in params if p["name"] == "model")["choices"]:
            return
        time.sleep(0.25)
    raise SystemExit(f"no worker reported the bench model {model}")


def wait_run_done(client: httpx.Client, run_id: str) -> dict[str, Any]:
    """Follow the run's events until `run_done` (the snapshot covers a run already finished)."""
    url = str(client.base_url).replace("http", "ws", 1).rstrip("/") + f"/v1/runs/{run_id}/events"
    token = client.headers["Authorization"].removeprefix("Bearer ")
    with connect(f"{url}?token={token}", open_timeout=30) as ws:
        for frame in ws:
            event = json.loads(frame)
            if event["type"] == "run_done":
                return event
            if event["type"] == "snapshot" and event["run"]["status"] not in ("queued", "running"):
                return event["run"]
    raise SystemExit(f"the event stream of run {run_id} closed before run_done")
