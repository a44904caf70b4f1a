"""Recovery in seconds (issue 10), shown with real processes on a private farm.

Each test kills or restarts something real — a worker (SIGKILL), the broker, the farm's database
sessions, the process that committed a run — and asserts outcomes only: every run ends exactly
once, with one take, none failed by the infrastructure. The times it measured are printed (see
them with `-s`); deadlines are generous, never the figure itself.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import pytest
from django.conf import settings

from tests.conftest import delay_graph, png, upload
from tests.e2e.recovery_helpers import (
    RECOVERY_ENV,
    RENEWAL_SQL,
    TERMINAL,
    RecoveryFarm,
    p50,
    recovery_farm_start,
    recovery_farm_stop,
    wait_until,
)
from tests.livefarm import REPO, Client, free_port

pytestmark = pytest.mark.e2e

# The issue asks for 10; 5 keep this file near 3 minutes on 2 cores (RECOVERY_KILL_TRIALS=10).
KILL_TRIALS = int(os.environ.get("RECOVERY_KILL_TRIALS", "5"))
_unique = itertools.count(1)


@pytest.fixture(scope="module")
def private_farm(
    django_db_setup: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RecoveryFarm]:
    db = dict(settings.DATABASES["default"])
    farm = recovery_farm_start(tmp_path_factory.mktemp("recovery"), db)
    try:
        yield farm
    finally:
        recovery_farm_stop(farm, db)


@pytest.fixture
def farm(private_farm: RecoveryFarm) -> RecoveryFarm:
    """The private farm with every process up (an earlier test may have killed or stopped some)."""
    private_farm.ensure_up()
    return private_farm


@pytest.fixture(scope="module")
def alice(private_farm: RecoveryFarm) -> Iterator[Client]:
    with private_farm.client("alice") as client:
        yield client


@pytest.fixture(scope="module")
def asset_id(alice: Client) -> str:
    return str(upload(alice, png(16, 16, (10, 120, 200))).json()["id"])


def delay(asset_id: str, seconds: float, **extra: Any) -> dict[str, Any]:
    """A delay graph no other submit of this module shares (identical ones would coalesce)."""
    return delay_graph(asset_id, round(seconds + next(_unique) / 1000, 3), **extra)


def submit(client: Client, body: dict[str, Any]) -> str:
    response = client.post("/v1/runs", json=body)
    assert response.status_code == 201, response.text
    return str(response.json()["runId"])


def wait_all(client: Client, run_ids: list[str], timeout: float) -> list[dict[str, Any]]:
    def finished() -> list[dict[str, Any]] | None:
        runs = [client.get(f"/v1/runs/{r}").json() for r in run_ids]
        return runs if all(run["status"] in TERMINAL for run in runs) else None

    return list(wait_until(f"{len(run_ids)} runs finishing", finished, timeout, every=0.2))


def assert_done_once(farm: RecoveryFarm, run: dict[str, Any]) -> None:
    """Succeeded, with exactly one take and one end (however many attempts it took)."""
    assert run["status"] == "succeeded", run
    assert len(run["takes"]) == 1 and farm.takes_of(run["id"]) == 1, run
    ends = [kind for kind, _ in farm.events_of(run["id"]) if kind == "run_done"]
    assert len(ends) == 1, ends


def wait_running(farm: RecoveryFarm, run_id: str, attempt: int, timeout: float = 60) -> float:
    """Wait until attempt `attempt` of the run is running; returns when it was seen."""
    wait_until(f"run {run_id} running attempt {attempt}",
               lambda: farm.run_row(run_id)[:2] == ("running", attempt), timeout, every=0.05)
    return time.monotonic()


# --- a lost worker ----------------------------------------------------------------------------


def test_a_worker_killed_mid_run_is_noticed_in_seconds_and_the_run_finishes_once(
    farm: RecoveryFarm, alice: Client, asset_id: str
) -> None:
    recoveries = []
    for _ in range(KILL_TRIALS):
        farm.run_workers_live()
        run_id = submit(alice, delay(asset_id, 2))
        wait_running(farm, run_id, attempt=1)
        killed, killed_at = farm.kill_worker_of(run_id)
        recoveries.append(wait_running(farm, run_id, attempt=2) - killed_at)

        run = alice.wait_run(run_id, timeout=90)
        assert_done_once(farm, run)
        assert run["attempts"] == 2
        (reason,) = farm.requeues_of(run_id)
        assert f"worker {killed} stopped heartbeating" in reason
    print(f"\nSIGKILL worker → running again: p50 {p50(recoveries):.1f} s, "
          f"max {max(recoveries):.1f} s over {len(recoveries)} trials "
          f"(INLINE_WORKER_LOST_SECONDS={farm.env['INLINE_WORKER_LOST_SECONDS']})")


def test_a_run_that_kills_its_worker_every_time_fails_after_max_attempts_saying_so(
    farm: RecoveryFarm, alice: Client, asset_id: str
) -> None:
    run_id = submit(alice, delay(asset_id, 60))
    max_attempts = int(farm.env["INLINE_MAX_ATTEMPTS"])
    for attempt in range(1, max_attempts + 1):
        wait_running(farm, run_id, attempt=attempt, timeout=90)
        farm.kill_worker_of(run_id)  # as a poison graph would: every worker that takes it dies

    run = alice.wait_run(run_id, timeout=90)
    assert run["status"] == "failed" and run["attempts"] == max_attempts, run
    assert run["error"]["code"] == "worker_lost"
    assert f"gave up after {max_attempts} attempts" in run["error"]["message"]
    assert "kills its worker" in run["error"]["message"]
    assert run["takes"] == []

    farm.run_workers_live()  # the fleet is still there, and serves the next run
    assert_done_once(farm, alice.wait_run(submit(alice, delay(asset_id, 0.2)), timeout=60))


# --- dispatch does not depend on the process that committed -----------------------------------


def test_a_run_whose_submitting_process_died_right_after_the_commit_still_starts(
    farm: RecoveryFarm, alice: Client, asset_id: str
) -> None:
    body = delay(asset_id, 0.5)
    died = farm.helper("submit-and-die", "alice", json.dumps(body))
    assert died.returncode == -9, died.stdout + died.stderr[-3000:]
    dead_at = time.monotonic()
    run_id = died.stdout.split()[0]
    assert "still alive" not in died.stdout  # killed in its first after-commit callback
    assert farm.sql("SELECT 1 FROM runs_run WHERE id = %s", run_id)  # committed

    started = wait_running(farm, run_id, attempt=1, timeout=60) - dead_at
    assert_done_once(farm, alice.wait_run(run_id, timeout=60))
    print(f"\nkill -9 right after the commit → running: {started:.1f} s")


def test_runs_in_flight_all_finish_when_the_broker_restarts(
    farm: RecoveryFarm, alice: Client, asset_id: str
) -> None:
    assert farm.redis is not None
    run_ids = [submit(alice, delay(asset_id, 3)) for _ in range(10)]
    wait_until("some runs running", lambda: farm.sql(
        "SELECT count(*) FROM runs_run WHERE status = 'running'")[0][0] >= 4, 60)
    farm.redis.stop()
    time.sleep(2)
    farm.redis.start()
    back_at = time.monotonic()

    runs = wait_all(alice, run_ids, timeout=120)
    took = time.monotonic() - back_at
    for run in runs:
        assert_done_once(farm, run)
    print(f"\nbroker back → all 10 done: {took:.1f} s (each run 3 s, 8 slots); attempts "
          f"{sorted(run['attempts'] for run in runs)}")


# --- the database -----------------------------------------------------------------------------


def test_terminating_every_database_session_mid_run_fails_no_run(
    farm: RecoveryFarm, alice: Client, asset_id: str
) -> None:
    run_ids = [submit(alice, delay(asset_id, 3)) for _ in range(6)]
    wait_until("runs running", lambda: farm.sql(
        "SELECT count(*) FROM runs_run WHERE status = 'running'")[0][0] >= 4, 60)
    time.sleep(0.5)  # mid-run: progress events are being written
    terminated = farm.sql("SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) "
                          "FROM pg_stat_activity WHERE datname = current_database() "
                          "AND pid <> pg_backend_pid()")[0][0]
    assert terminated >= 3  # at least web, the workers, the control worker

    runs = wait_all(alice, run_ids, timeout=120)
    for run in runs:
        assert_done_once(farm, run)
    print(f"\nterminated {terminated} sessions with {len(run_ids)} runs in flight: 0 failed; "
          f"attempts {sorted(run['attempts'] for run in runs)}")


@pytest.mark.flaky(reruns=1)  # once in CI (and once on a loaded branch) no renewal failed in 30 s
def test_a_failed_lease_renewal_does_not_restart_a_healthy_run(
    farm: RecoveryFarm, alice: Client, asset_id: str
) -> None:
    run_id = submit(alice, delay(asset_id, 12))
    wait_running(farm, run_id, attempt=1)
    lease = farm.run_row(run_id)[2]
    worker = lease.split("#", 1)[0]

    def renewal_session() -> list[tuple[Any, ...]]:
        # The one session whose last statement renewed a lease: the presence thread of the
        # worker holding the run, the only run in flight (an idle worker renews nothing, and its
        # beat's last statement is its heartbeat). The lease key is a bound parameter, not in
        # the text (server-side binding): two such sessions would be an ambiguity, not a pick.
        # Only a session busy within the last beat: a pooled session that renewed once and went
        # back to the pool (a thread whose beat failed returns its connection) renews nothing.
        beat = float(RECOVERY_ENV["INLINE_WORKER_HEARTBEAT"])
        sessions = farm.sql("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                            "AND query LIKE %s AND state_change > now() - make_interval(secs => "
                            "%s)", f"%{RENEWAL_SQL}%", beat)
        return sessions if len(sessions) == 1 else []

    log = farm.logs / f"{farm.names[worker]}.log"
    failed_beat = f"heartbeat of {worker} failed"
    failures = log.read_text(errors="replace").count(failed_beat)
    (pid,) = wait_until("the lease renewal's session", renewal_session, 30)[0]
    farm.sql("SELECT pg_terminate_backend(%s)", pid)
    killed = farm.sql("SELECT now()")[0][0]

    wait_until("the next renewal failing", lambda: log.read_text(errors="replace").count(
        failed_beat) > failures, 30)
    wait_until("the worker beating again", lambda: farm.sql(
        "SELECT 1 FROM fleet_worker WHERE name = %s AND last_heartbeat > %s", worker, killed), 30)
    run = alice.wait_run(run_id, timeout=60)
    assert_done_once(farm, run)
    assert run["attempts"] == 1 and farm.requeues_of(run_id) == []


# --- idempotent submits -----------------------------------------------------------------------


def test_a_retried_client_run_id_returns_the_same_run_after_coalescing_and_finishing(
    farm: RecoveryFarm, alice: Client, asset_id: str
) -> None:
    body = delay(asset_id, 2)
    first, retry = str(uuid.uuid4()), str(uuid.uuid4())
    run_id = submit(alice, {**body, "clientRunId": first})
    coalesced = alice.post("/v1/runs", json={**body, "clientRunId": retry})
    assert (coalesced.status_code, coalesced.json()["runId"]) == (200, run_id)

    with ThreadPoolExecutor(4) as pool:  # a client retrying in a hurry, while it runs
        answers = list(pool.map(lambda _: alice.post("/v1/runs", json={
            **body, "clientRunId": retry}).json()["runId"], range(8)))
    assert set(answers) == {run_id}
    assert_done_once(farm, alice.wait_run(run_id, timeout=60))

    again = submit(alice, body)  # no longer in flight: the same graph is a new run now
    assert again != run_id
    for key in (retry, first, retry):
        late = alice.post("/v1/runs", json={**body, "clientRunId": key})
        assert (late.status_code, late.json()["runId"]) == (200, run_id)
    alice.wait_run(again, timeout=60)


# --- ./farm up --------------------------------------------------------------------------------


def _farm_up(farm: RecoveryFarm, port: int, log: Path) -> subprocess.Popen[bytes]:
    """`./farm up` with one worker, on the private farm's database and Redis (already migrated;
    DATABASE_URL and BROKER_URL set, as an operator with their own services would run it) and
    its data dir (the uploaded asset's blob is there)."""
    command = [str(REPO / "farm"), "up", "--port", str(port), "--workers", "1", "--slots", "2",
               "--profile", "cpu", "--data-dir", farm.env["INLINE_DATA_DIR"],
               "--models-dir", farm.env["INLINE_MODELS_DIR"]]
    with log.open("ab") as out:
        return subprocess.Popen(command, cwd=REPO, env=farm.env, stdout=out,
                                stderr=subprocess.STDOUT)


def _stop_farm_up(up: subprocess.Popen[bytes]) -> int:
    if up.poll() is not None:
        return up.returncode
    children = psutil.Process(up.pid).children(recursive=True)
    up.send_signal(signal.SIGINT)
    try:
        return up.wait(timeout=60)
    finally:
        for child in children:
            if child.is_running():
                child.kill()


def test_farm_up_restarts_a_killed_worker_keeps_answering_and_the_run_finishes(
    private_farm: RecoveryFarm, alice: Client, asset_id: str
) -> None:
    farm = private_farm
    farm.stop_all()  # ./farm up brings its own web, worker, control worker and beat
    log = farm.logs / "up.log"
    port = free_port()
    up = _farm_up(farm, port, log)
    try:
        wait_until("./farm up ready", lambda: up.poll() is not None
                   or "Inline Farm is up." in log.read_text(errors="replace"), 180, every=0.5)
        assert up.poll() is None, log.read_text(errors="replace")[-4000:]
        client = Client(base_url=f"http://127.0.0.1:{port}", headers=alice.headers, timeout=30)
        run_id = submit(client, delay(asset_id, 3))
        wait_running(farm, run_id, attempt=1)
        first = farm.run_row(run_id)[2]
        (worker,) = [p for p in psutil.Process(up.pid).children()
                     if any(part.startswith("worker1@") for part in p.cmdline())]
        worker.kill()
        killed_at = time.monotonic()

        health: list[int] = []

        def finished() -> dict[str, Any] | None:
            assert up.poll() is None, log.read_text(errors="replace")[-4000:]
            health.append(client.get("/v1/health").status_code)
            response = client.get(f"/v1/runs/{run_id}")
            assert response.status_code == 200, response.text
            run = response.json()
            return run if run["status"] in TERMINAL else None

        run = wait_until("the run finishing on the restarted worker", finished, 120, every=0.25)
        took = time.monotonic() - killed_at
        # It kept answering while its only worker was down (zero workers is never a 503; a probe
        # timing out on a loaded 2-core machine can be, and is not what this test is about).
        assert health and set(health) <= {200, 503}
        assert_done_once(farm, run)
        assert run["attempts"] == 2
        second = farm.run_row(run_id)[2]
        assert second.split("#")[0] == first.split("#")[0] and second != first  # worker1, reborn
        assert "worker1 exited with code -9; restarting it" in log.read_text(errors="replace")
        print(f"\n./farm up: worker SIGKILLed → restarted, its run done in {took:.1f} s "
              f"({len(health)} health checks answered meanwhile)")
        assert _stop_farm_up(up) == 0, log.read_text(errors="replace")[-4000:]
    finally:
        _stop_farm_up(up)


def test_a_submit_after_every_database_session_was_terminated_is_accepted(
    farm: RecoveryFarm, alice: Client, asset_id: str
) -> None:
    """The web's pooled connections are checked as they leave the pool (Django's
    CONN_HEALTH_CHECKS): one whose session was terminated while it sat there is replaced, never
    handed to a request (which would answer 500)."""
    alice.wait_run(submit(alice, delay(asset_id, 0)), timeout=60)  # the web's pool holds some
    terminated = farm.sql("SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) "
                          "FROM pg_stat_activity WHERE datname = current_database() "
                          "AND pid <> pg_backend_pid()")[0][0]
    assert terminated >= 3
    time.sleep(0.5)  # the sessions' FATAL messages and EOFs reach the idle sockets
    run_ids = [submit(alice, delay(asset_id, 0)) for _ in range(4)]
    assert all(run["status"] == "succeeded" for run in wait_all(alice, run_ids, timeout=120))
