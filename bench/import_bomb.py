"""Other users' `GET /v1/runs` while four clients post subgraph bombs to the importer, against
the same reads on an idle farm (issue 40: the bomb took 42 s of web CPU and slowed everyone 6×).

    DATABASE_URL=… BROKER_URL=… .venv/bin/python bench/import_bomb.py [--reads 300]

Four clients each post the issue's bomb every --pause seconds (0.1: 40 bombs a second). Prints
p50 / p99 of the reads idle and under the bombs (alternating rounds, so both see the same
phases of the machine), their ratio, how many bombs were answered and with which status, and
the web's CPU per bomb.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._farm import bench_farm
from tests.apps.importer.builder import bomb  # the workflow the importer tests refuse


def reads(client: httpx.Client, count: int) -> list[float]:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        client.get("/v1/runs").raise_for_status()
        times.append((time.perf_counter() - started) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reads", type=int, default=300, help="reads per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pause", type=float, default=0.1,
                        help="seconds each of the 4 bombing clients waits between bombs (0: a "
                        "tight loop, which saturates the web with any request)")
    args = parser.parse_args()
    with bench_farm() as (farm, token, _models):
        headers = {"Authorization": f"Bearer {token}"}
        reader = httpx.Client(base_url=farm.url, headers=headers, timeout=60)
        web = psutil.Process(farm.procs["web"].pid)
        doc = bomb(4, 10)  # the issue's: sgN holds 10 of sgN-1, four levels
        idle: list[float] = []
        loaded: list[float] = []
        statuses: dict[int, int] = {}
        bombs = 0
        bomb_cpu = 0.0
        for _ in range(args.rounds):
            idle += reads(reader, args.reads)
            stop = threading.Event()

            def post_bombs(stop: threading.Event = stop) -> None:
                nonlocal bombs
                with httpx.Client(base_url=farm.url, headers=headers, timeout=120) as client:
                    while not stop.is_set():
                        status = client.post("/v1/import/comfy", json=doc).status_code
                        statuses[status] = statuses.get(status, 0) + 1
                        bombs += 1
                        stop.wait(args.pause)

            cpu_before = sum(web.cpu_times()[:2])
            posters = [threading.Thread(target=post_bombs) for _ in range(4)]
            for t in posters:
                t.start()
            loaded += reads(reader, args.reads)
            stop.set()
            for t in posters:
                t.join()
            bomb_cpu += sum(web.cpu_times()[:2]) - cpu_before

        def p(values: list[float], q: float) -> float:
            return statistics.quantiles(values, n=100)[int(q) - 1]

        print(f"GET /v1/runs idle:        p50 {statistics.median(idle):.2f} ms, "
              f"p99 {p(idle, 99):.2f} ms ({len(idle)} reads)")
        print(f"GET /v1/runs under bombs: p50 {statistics.median(loaded):.2f} ms, "
              f"p99 {p(loaded, 99):.2f} ms ({len(loaded)} reads)")
        print(f"p99 under bombs / idle: {p(loaded, 99) / p(idle, 99):.2f}")
        print(f"bombs answered: {bombs} {statuses}; web CPU while they ran (reads included): "
              f"{bomb_cpu * 1000 / max(bombs, 1):.2f} ms per bomb")


if __name__ == "__main__":
    main()
