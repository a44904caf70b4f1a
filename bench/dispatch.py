"""Dispatch stays flat as the queue grows: submit → claimed and submits/s, 10 vs 10,000 queued.

    DATABASE_URL=… BROKER_URL=… .venv/bin/python bench/dispatch.py [--deep 10000] [--runs 100] [--rounds 2]

One throwaway farm (web, one worker with the default slots, beat). Measured in one run with
`--shallow` (10) runs already queued and with `--deep` (10,000), alternating (shallow, deep,
deep, shallow for the default `--rounds 2`) — the backlog owned by 100
users, waiting on `gpu.48g`, a GPU class whose workers are away (as during a maintenance
window). Every beat pass and every dispatch still walks the farm's queued runs, and the
tables and indexes are that deep; the measured runs are image graphs on `cpu`:

- submit → claimed p50 (the run's startedAt − createdAt, sequential submits), over every round;
- submits/s of a burst of 200 from 8 threads by 8 users (counted from the first submit, the
  clients connected before), the median of the rounds;
- the ratio deep / shallow for both.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import uuid
from contextlib import closing
from datetime import datetime
from pathlib import Path

import httpx
import psycopg

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench._farm import bench_farm, connected_clients, each_user, per_second  # noqa: E402
from bench.hotpath import _graph, _png, more_tokens, wait_done, wait_for_worker  # noqa: E402

# A model no live worker holds: the reroute pass leaves these runs where they wait.
NEEDS_A_GPU = ('{"nodeTypes": ["zimage/turbo"], '
               '"models": [{"folder": "diffusion_models", "name": "z.safetensors"}]}')


def backlog(database_url: str, count: int, users: int = 100) -> None:
    """`count` queued runs on gpu.48g owned by `users` users (straight into the tables); the
    previous backlog is deleted and vacuumed away first, so a shallow phase after a deep one
    does not walk 10,000 dead index entries."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("DELETE FROM runs_run WHERE queue = 'gpu.48g'")
        conn.execute("VACUUM runs_run")
        ids = []
        for i in range(users):
            row = conn.execute(
                "INSERT INTO auth_user (password, is_superuser, username, first_name, last_name, "
                "email, is_staff, is_active, date_joined) VALUES ('', false, %s, '', '', '', "
                "false, true, now()) ON CONFLICT (username) DO UPDATE SET is_active = true "
                "RETURNING id", [f"backlog{i}"]).fetchone()
            assert row is not None
            ids.append(row[0])
        graph = conn.execute(
            "INSERT INTO graphs_graph (sha256, document, created_at) VALUES (%s, '{}'::jsonb, now()) "
            "ON CONFLICT (sha256) DO UPDATE SET sha256 = excluded.sha256 RETURNING id",
            ["b" * 64]).fetchone()
        assert graph is not None
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO runs_run (id, owner_id, graph_id, target, status, priority, requirement, "
                "queue, attempts, lease_worker, last_seq, error_code, error_message, error_node, "
                "created_at) VALUES (%s, %s, %s, %s, 'queued', 0, %s::jsonb, 'gpu.48g', 0, '', 0, "
                "'', '', '', now())",
                [(uuid.uuid4(), ids[i % users], graph[0], f"t{i}", NEEDS_A_GPU) for i in range(count)])
        # As a farm whose runs have waited a while finds them: vacuumed and analysed (else
        # autovacuum takes the 10,000 inserts up in the middle of a measured phase).
        conn.execute("VACUUM (ANALYZE) runs_run")


def to_claimed(client: httpx.Client, asset: str, runs: int, offset: int) -> list[float]:
    latencies = []
    for n in range(runs):
        run_id = client.post("/v1/runs", json=_graph(asset, offset + n)).json()["runId"]
        run, _ = wait_done(client, run_id)
        assert run["status"] == "succeeded", run
        latencies.append(datetime.fromisoformat(run["startedAt"]).timestamp()
                         - datetime.fromisoformat(run["createdAt"]).timestamp())
    return latencies


def submits_per_second(url: str, tokens: list[str], assets: dict[str, str], total: int,
                       offset: int) -> float:
    per_user = total // len(tokens)
    stamps: list[float] = []
    lock = threading.Lock()
    clients = connected_clients(url, tokens)
    start = time.time()

    def user(token: str, k: int) -> None:
        with closing(clients[token]) as client:
            for n in range(per_user):
                r = client.post("/v1/runs", json=_graph(assets[token], offset + k * 1000 + n))
                assert r.status_code in (200, 201), r.text
                with lock:
                    stamps.append(time.time())

    each_user(tokens, user)
    return per_second(stamps, start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shallow", type=int, default=10)
    parser.add_argument("--deep", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2, help="shallow+deep pairs (default 2)")
    args = parser.parse_args()
    if args.rounds < 1 or args.runs < 1:
        parser.error("--rounds and --runs must be at least 1")
    latencies: dict[str, list[float]] = {"shallow": [], "deep": []}
    rates: dict[str, list[float]] = {"shallow": [], "deep": []}
    with bench_farm(beat=True) as (farm, token, _models):
        tokens = [token, *more_tokens(farm.env, 8)]
        client = httpx.Client(base_url=farm.url, headers={"Authorization": f"Bearer {token}"},
                              timeout=60)
        wait_for_worker(farm.url)
        assets = {t: httpx.post(f"{farm.url}/v1/assets", headers={"Authorization": f"Bearer {t}"},
                                files={"file": ("a.png", _png(), "image/png")}).json()["id"]
                  for t in tokens}
        to_claimed(client, assets[token], 10, 0)  # warm up, and with a burst: a farm in service
        submits_per_second(farm.url, tokens, assets, 200, 60_000)
        # Rounds in the order shallow, deep, deep, shallow, …: the machine's speed drifts and
        # swings over a run (README, Benchmarks); alternating spreads it over both depths.
        order = [("shallow", "deep") if r % 2 == 0 else ("deep", "shallow") for r in range(args.rounds)]
        offset = 100_000
        for label in (label for pair in order for label in pair):
            depth = args.shallow if label == "shallow" else args.deep
            backlog(farm.env["DATABASE_URL"], depth)
            time.sleep(2)  # a few beat passes over the new backlog
            latencies[label] += to_claimed(client, assets[token], args.runs, offset)
            rates[label].append(submits_per_second(farm.url, tokens, assets, 200, offset + 50_000))
            offset += 100_000
            time.sleep(3)  # let the burst drain before the next state

    print(f"\ndispatch, {args.rounds} rounds of {args.runs} sequential submits + a burst of 200 "
          f"from 8 threads, per depth:")
    print(f"  {'queued':>8}  {'submit → claimed p50':>22}  {'submits/s (median)':>19}  bursts")
    p50 = {k: statistics.median(v) * 1000 for k, v in latencies.items()}
    rate = {k: statistics.median(v) for k, v in rates.items()}
    for label in ("shallow", "deep"):
        depth = args.shallow if label == "shallow" else args.deep
        bursts = ", ".join(f"{r:.0f}" for r in rates[label])
        print(f"  {depth:>8}  {p50[label]:>19.2f} ms  {rate[label]:>19.0f}  {bursts}")
    print(f"  ratio deep/shallow: latency {p50['deep'] / p50['shallow']:.2f}, "
          f"submits/s {rate['deep'] / rate['shallow']:.2f}")


if __name__ == "__main__":
    main()
