"""Dispatch stays flat as the queue grows: submit → claimed and submits/s, 10 vs 10,000 queued.

    DATABASE_URL=… BROKER_URL=… .venv/bin/python bench/dispatch.py [--deep 10000] [--runs 100]

One throwaway farm (web, one worker with the default slots, beat). Measured twice in one run:
first with `--shallow` (10) runs already queued, then with `--deep` (10,000) — owned by 100
users, waiting on `gpu.48g`, a GPU class whose workers are away (as during a maintenance
window). Every beat pass and every dispatch still walks the farm's queued runs, and the
tables and indexes are that deep; the measured runs are image graphs on `cpu`:

- submit → claimed p50 (the run's startedAt − createdAt, sequential submits);
- submits/s of a burst of 200 from 8 threads by 8 users;
- the ratio deep / shallow for both.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path

import httpx
import psycopg

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench._farm import bench_farm, each_user, per_second  # noqa: E402
from bench.hotpath import _graph, _png, more_tokens, wait_done, wait_for_worker  # noqa: E402

# A model no live worker holds: the reroute pass leaves these runs where they wait.
NEEDS_A_GPU = ('{"nodeTypes": ["zimage/turbo"], '
               '"models": [{"folder": "diffusion_models", "name": "z.safetensors"}]}')


def backlog(database_url: str, count: int, users: int = 100) -> None:
    """`count` queued runs on gpu.48g owned by `users` users (straight into the tables)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("DELETE FROM runs_run WHERE queue = 'gpu.48g'")
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
        conn.execute("ANALYZE runs_run")


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
    start = time.time()

    def user(token: str, k: int) -> None:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"},
                          timeout=60) as client:
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
    args = parser.parse_args()
    results = {}
    with bench_farm(beat=True) as (farm, token, _models):
        tokens = [token, *more_tokens(farm.env, 8)]
        client = httpx.Client(base_url=farm.url, headers={"Authorization": f"Bearer {token}"},
                              timeout=60)
        wait_for_worker(farm.url)
        assets = {t: httpx.post(f"{farm.url}/v1/assets", headers={"Authorization": f"Bearer {t}"},
                                files={"file": ("a.png", _png(), "image/png")}).json()["id"]
                  for t in tokens}
        to_claimed(client, assets[token], 10, 0)  # warm up
        for label, depth, offset in (("shallow", args.shallow, 100_000),
                                     ("deep", args.deep, 200_000)):
            backlog(farm.env["DATABASE_URL"], depth)
            time.sleep(2)  # a few beat passes over the new backlog
            lat = to_claimed(client, assets[token], args.runs, offset)
            rate = submits_per_second(farm.url, tokens, assets, 200, offset + 50_000)
            time.sleep(3)  # let the burst drain before the next state
            results[label] = (depth, statistics.median(lat) * 1000, rate)

    print(f"\ndispatch, {args.runs} sequential submits + a burst of 200 from 8 threads:")
    print(f"  {'queued':>8}  {'submit → claimed p50':>22}  {'submits/s':>10}")
    for label in ("shallow", "deep"):
        depth, p50, rate = results[label]
        print(f"  {depth:>8}  {p50:>19.2f} ms  {rate:>10.0f}")
    (_, s_p50, s_rate), (_, d_p50, d_rate) = results["shallow"], results["deep"]
    print(f"  ratio deep/shallow: latency {d_p50 / s_p50:.2f}, submits/s {d_rate / s_rate:.2f}")


if __name__ == "__main__":
    main()
