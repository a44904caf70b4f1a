"""Two checkouts' hot paths, compared run by run on one machine: A, B, A, B, …

    DATABASE_URL=… BROKER_URL=… .venv/bin/python bench/ab.py OTHER_CHECKOUT [--runs 300]

This box's speed swings by up to ~2× from minute to minute (other tenants), so two benchmark
runs one after the other compare the machine's phases as much as the code. Here both farms are
up at once (this checkout's and OTHER_CHECKOUT's, each the processes of bench/hotpath.py: web,
one worker, beat, on a database of its own) and the client alternates bench/hotpath.py's
sequential run between them: every phase of the machine falls on both alike. The idle farm
only heartbeats meanwhile. B's broker and channel layer are the Redis databases two above
BROKER_URL's and CHANNEL_REDIS_URL's.

Printed per farm: submit → done p50 / p90 and the CPU per run of its web and worker, and the
ratio B / A of the p50s; then `--polls` polls of a finished run (p50, p90, the web's CPU per
poll); with `--bursts K`, then K bursts on each, alternating, their accepted/s and
completed/s and the CPU per run of each farm's web and worker over its bursts.
OTHER_CHECKOUT needs its own `.venv` (a symlink to this one's is fine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.hotpath import _graph, _png, burst, wait_done  # noqa: E402

# Run in each checkout: bring its farm up, say where it is, and hold it until stdin closes.
_HOLD = """
import json, sys
sys.path.insert(0, ".")
from bench._farm import bench_farm
from bench.hotpath import more_tokens, wait_for_worker
with bench_farm(beat=True) as (farm, token, _models):
    wait_for_worker(farm.url)
    print(json.dumps({"url": farm.url, "tokens": [token, *more_tokens(farm.env, 8)],
                      "web": farm.procs["web"].pid, "worker": farm.procs["worker1"].pid}),
          flush=True)
    sys.stdin.read()
"""


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _other_db(url: str) -> str:
    """`url` on the Redis database two above its own: B's broker and channel layer must not be
    A's (both workers serve queue `cpu`; one would take the other's runs)."""
    base, _, db = url.rstrip("/").rpartition("/")
    if not db.isdigit():
        raise SystemExit(f"give BROKER_URL and CHANNEL_REDIS_URL a database number: {url}")
    return f"{base}/{int(db) + 2}"


def _hold(checkout: Path, env: dict[str, str]) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    proc = subprocess.Popen([str(checkout / ".venv" / "bin" / "python"), "-c", _HOLD],
                            cwd=checkout, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env={**os.environ, **env, "PYTHONPATH": str(checkout)})
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise SystemExit(f"the farm of {checkout} did not come up")
    return proc, json.loads(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("other", type=Path, help="the checkout to compare with (B)")
    parser.add_argument("--runs", type=int, default=300, help="sequential runs on each farm")
    parser.add_argument("--polls", type=int, default=1000,
                        help="then this many polls of one finished run on each, alternating "
                             "in tens: a client's GET /v1/runs/{id} alone")
    parser.add_argument("--bursts", type=int, default=0,
                        help="then this many bursts on each, alternating (bench/hotpath.py's: "
                             "200 runs from 8 threads by 8 users)")
    args = parser.parse_args()
    farms = {}
    holders = []
    run_id_of: dict[str, str] = {}
    try:
        other_env = {k: _other_db(os.environ[k]) for k in ("BROKER_URL", "CHANNEL_REDIS_URL")}
        for label, checkout, env in (("A", REPO, {}), ("B", args.other.resolve(), other_env)):
            proc, farm = _hold(checkout, env)
            holders.append(proc)
            assets = {t: httpx.post(f"{farm['url']}/v1/assets", files={
                "file": ("a.png", _png(), "image/png")}, headers={"Authorization": f"Bearer {t}"}
            ).json()["id"] for t in farm["tokens"]}
            client = httpx.Client(base_url=farm["url"], timeout=60,
                                  headers={"Authorization": f"Bearer {farm['tokens'][0]}"})
            farms[label] = {**farm, "checkout": checkout, "client": client, "assets": assets,
                            "asset": assets[farm["tokens"][0]], "times": [], "bursts": [],
                            "cpu": {"web": 0.0, "worker": 0.0},
                            "burst_cpu": {"web": 0.0, "worker": 0.0}}
        for n in range(-20, args.runs):  # 20 warm-up runs each
            for farm in farms.values():
                before = {k: _cpu(farm[k]) for k in ("web", "worker")}
                started = time.perf_counter()
                run_id = farm["client"].post("/v1/runs", json=_graph(farm["asset"], n + 40)
                                             ).json()["runId"]
                run, _ = wait_done(farm["client"], run_id)
                assert run["status"] == "succeeded", run
                run_id_of[farm["url"]] = run_id
                if n >= 0:
                    farm["times"].append(time.perf_counter() - started)
                    for k in ("web", "worker"):
                        farm["cpu"][k] += _cpu(farm[k]) - before[k]
        for farm in farms.values():
            farm["polled"] = run_id_of[farm["url"]]
            farm["polls"], farm["poll_cpu"] = [], 0.0
        for _ in range(0, args.polls, 10):
            for farm in farms.values():
                before_web = _cpu(farm["web"])
                for _ in range(10):
                    started = time.perf_counter()
                    farm["client"].get(f"/v1/runs/{farm['polled']}").raise_for_status()
                    farm["polls"].append(time.perf_counter() - started)
                farm["poll_cpu"] += _cpu(farm["web"]) - before_web
        for _ in range(args.bursts):
            for farm in farms.values():
                before = {k: _cpu(farm[k]) for k in ("web", "worker")}
                farm["bursts"].append(burst(farm["url"], farm["tokens"], farm["assets"], 200))
                for k in before:
                    farm["burst_cpu"][k] += _cpu(farm[k]) - before[k]
    finally:
        for proc in holders:
            proc.communicate("")

    print(f"\nA/B, {args.runs} sequential hot-path runs each, alternating run by run:")
    p50 = {}
    for label, farm in farms.items():
        times = sorted(farm["times"])
        p50[label] = statistics.median(times) * 1000
        cpu = ", ".join(f"{k} {v / args.runs * 1000:.2f}" for k, v in farm["cpu"].items())
        print(f"  {label} {farm['checkout']!s:<28} submit → done p50 {p50[label]:6.2f} ms, "
              f"p90 {times[int(0.9 * len(times))] * 1000:6.2f} ms; CPU per run (ms): {cpu}")
    print(f"  B / A p50: {p50['B'] / p50['A']:.2f}")
    if args.polls:
        print(f"\n{len(farms['A']['polls'])} polls of a finished run each (GET /v1/runs/{{id}}), "
              "alternating in tens:")
        for label, farm in farms.items():
            polls = sorted(farm["polls"])
            print(f"  {label} poll p50 {statistics.median(polls) * 1000:6.3f} ms, p90 "
                  f"{polls[int(0.9 * len(polls))] * 1000:6.3f} ms; web CPU per poll "
                  f"{farm['poll_cpu'] / len(polls) * 1000:.3f} ms")
    for label, farm in farms.items():
        if farm["bursts"]:
            pairs = "; ".join(f"{a:.0f} / {c:.0f}" for a, c in farm["bursts"])
            runs = 200 * len(farm["bursts"])
            cpu = ", ".join(f"{k} {v / runs * 1000:.2f}" for k, v in farm["burst_cpu"].items())
            print(f"  {label} bursts of 200, accepted/s / completed/s: {pairs}; CPU per run "
                  f"(ms): {cpu}")


if __name__ == "__main__":
    main()
