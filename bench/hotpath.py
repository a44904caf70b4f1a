"""The control plane's cost per run: where the time goes, and throughput, on an image-only graph.

    DATABASE_URL=… BROKER_URL=… .venv/bin/python bench/hotpath.py [--runs 200] [--burst 200]

Graph: image/load → image/resize (a new size every run, so no cache answers) → image/save,
submitted over /v1 to a throwaway farm (web + one worker with the default slots + beat, the
processes `./farm up` starts); completion seen by polling `GET /v1/runs/{id}` as an outside
client would. Printed side by side, in one run:

- the floor: the same Pillow work in this process (decode the PNG, resize, encode the take);
- sequential submit → done (p50 / p90) and its breakdown per run: HTTP submit, submit → claimed
  (insert, dispatch, broker hop, claim), each node, claimed → finished (nodes, take, finish),
  finished → the client's poll saw it;
- the CPU each process spent per sequential run (web, worker, every PostgreSQL process, this
  client), from /proc: steadier than wall time on a shared box, and where a burst's
  throughput goes (2 cores serve ~2,000 ms of CPU a second);
- a burst: `--burst` runs from 8 threads by 8 users: accepted/s and completed/s (each thread
  submits its runs, then polls each until done, pausing 20 ms between polls), counted from the
  first submit: the threads' clients are made and connected before the clock starts, and one
  burst before it warms the farm up (each user's first requests, the web's pooled connections
  preparing their statements), as a farm in service is.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
from PIL import Image

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench._farm import bench_farm, connected_clients, each_user, per_second  # noqa: E402


def _png(size: int = 64) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (size, size), (120, 60, 200)).save(out, format="PNG")
    return out.getvalue()


def _graph(asset: str, n: int) -> dict[str, Any]:
    w, h = 32 + n % 97, 32 + (n // 97) % 97
    return {"graph": {"nodes": {
        "src": {"type": "image/load", "params": {"asset": asset}},
        "big": {"type": "image/resize", "params": {"width": w, "height": h},
                "inputs": {"image": {"node": "src", "port": "image"}}},
        "out": {"type": "image/save", "inputs": {"image": {"node": "big", "port": "image"}}}}},
        "target": "out"}


def floor(data: bytes, runs: int) -> list[float]:
    """The same image work in-process: decode, resize, PNG-encode the take (the farm's settings)."""
    from workers.executor import png_bytes

    times = []
    for n in range(runs):
        started = time.perf_counter()
        image = Image.open(io.BytesIO(data)).convert("RGB")
        w, h = 32 + n % 97, 32 + (n // 97) % 97
        png_bytes(image.resize((w, h), Image.Resampling.LANCZOS), {"graphSha256": "x" * 64})
        times.append(time.perf_counter() - started)
    return times


def wait_done(client: httpx.Client, run_id: str, pause: float = 0.0) -> tuple[dict[str, Any], float]:
    """Poll until the run ends; `pause` between polls (0: as fast as the server answers)."""
    while True:
        run = client.get(f"/v1/runs/{run_id}").json()
        if run["status"] in ("succeeded", "failed", "cancelled"):
            return run, time.time()
        if pause:
            time.sleep(pause)


def sequential(client: httpx.Client, asset: str, runs: int) -> list[dict[str, Any]]:
    from datetime import datetime

    rows: list[dict[str, Any]] = []
    for n in range(runs):
        t0 = time.time()
        submitted = client.post("/v1/runs", json=_graph(asset, n))
        t1 = time.time()
        run, seen = wait_done(client, submitted.json()["runId"])
        assert run["status"] == "succeeded", run
        created = datetime.fromisoformat(run["createdAt"]).timestamp()
        started = datetime.fromisoformat(run["startedAt"]).timestamp()
        finished = datetime.fromisoformat(run["finishedAt"]).timestamp()
        rows.append({"total": seen - t0, "http_submit": t1 - t0, "to_claim": started - created,
                     "claim_to_finish": finished - started, "finish_to_seen": seen - finished,
                     "run_id": run["id"]})
    return rows


def cpu_seconds(farm: Any) -> dict[str, float]:
    """CPU seconds used so far (user + system) by the farm's web and worker processes, by every
    PostgreSQL server process (the farm's backends and the server's own), and by this client."""
    tick = os.sysconf("SC_CLK_TCK")

    def of(pid: int) -> float:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / tick  # utime, stime

    postgres = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
                and _comm(p) == "postgres"]
    times = os.times()
    return {"web": of(farm.procs["web"].pid), "worker": of(farm.procs["worker1"].pid),
            "postgres": sum(of(pid) for pid in postgres), "client": times.user + times.system}


def _comm(proc: Path) -> str:
    try:
        return (proc / "comm").read_text().strip()
    except OSError:
        return ""


def node_ms(database_url: str, run_ids: list[str]) -> dict[str, float]:
    import psycopg

    per: dict[str, list[float]] = {}
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT payload FROM runs_runevent WHERE type = 'node_done' "
                            "AND run_id = ANY(%s::uuid[])", [run_ids]).fetchall()
    for (payload,) in rows:
        per.setdefault(payload["nodeType"], []).append(payload["ms"])
    return {k: statistics.median(v) for k, v in per.items()}


def more_tokens(env: dict[str, str], count: int) -> list[str]:
    import subprocess

    return [subprocess.run([sys.executable, "manage.py", "farm_token", f"bench{i}"], cwd=REPO,
                           env=env, check=True, capture_output=True, text=True
                           ).stdout.strip().splitlines()[-1] for i in range(1, count)]


def wait_for_worker(url: str) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if (httpx.get(f"{url}/v1/health").json().get("workers") or 0) > 0:
            return
        time.sleep(0.3)
    raise SystemExit("no worker came up")


def burst(url: str, tokens: list[str], asset_of: dict[str, str], total: int) -> tuple[float, float]:
    """accepted/s and completed/s of `total` runs from one thread per token; the clock starts
    once every thread's client is connected (bench/_farm.py `connected_clients`)."""
    per_user = total // len(tokens)
    accepted: list[float] = []
    done: list[float] = []
    lock = threading.Lock()
    clients = connected_clients(url, tokens)
    start = time.time()

    def user(token: str, k: int) -> None:
        with closing(clients[token]) as client:
            ids = []
            for n in range(per_user):
                r = client.post("/v1/runs", json=_graph(asset_of[token], 10_000 + k * 1000 + n))
                assert r.status_code in (200, 201), r.text
                ids.append(r.json()["runId"])
                with lock:
                    accepted.append(time.time())
            for run_id in ids:  # 8 pollers spinning would take the CPU the farm needs
                run, seen = wait_done(client, run_id, pause=0.02)
                assert run["status"] == "succeeded", run
                with lock:
                    done.append(seen)

    each_user(tokens, user)
    return per_second(accepted, start), per_second(done, start)


def _p(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--burst", type=int, default=200)
    args = parser.parse_args()
    data = _png()
    with bench_farm(beat=True) as (farm, token, _models):
        tokens = [token, *more_tokens(farm.env, 8)]
        client = httpx.Client(base_url=farm.url, headers={"Authorization": f"Bearer {tokens[0]}"},
                              timeout=60)
        wait_for_worker(farm.url)
        asset_of = {}
        for t in tokens:
            r = httpx.post(f"{farm.url}/v1/assets", headers={"Authorization": f"Bearer {t}"},
                           files={"file": ("a.png", data, "image/png")})
            asset_of[t] = r.json()["id"]
        sequential(client, asset_of[tokens[0]], 10)  # warm up every process
        cpu_before = cpu_seconds(farm)
        rows = sequential(client, asset_of[tokens[0]], args.runs)
        cpu_after = cpu_seconds(farm)
        nodes = node_ms(farm.env["DATABASE_URL"], [r["run_id"] for r in rows])
        base = floor(data, args.runs)
        burst(farm.url, tokens, asset_of, args.burst)  # warm up: each user's first requests
        acc, comp = burst(farm.url, tokens, asset_of, args.burst)

    f50 = statistics.median(base) * 1000
    total = [r["total"] for r in rows]
    print(f"\nhot path, {args.runs} sequential runs (image/load → image/resize → image/save):")
    print(f"  in-process Pillow floor p50            {f50:7.2f} ms")
    print(f"  farm submit → done p50 / p90           {_p(total, .5):7.2f} / {_p(total, .9):.2f} ms"
          f"   ({_p(total, .5) / f50:.1f}× the floor)")
    print("  breakdown (p50 per run):")
    for key, label in (("http_submit", "HTTP submit (validate, insert, dispatch)"),
                       ("to_claim", "created → claimed (broker hop, claim)"),
                       ("claim_to_finish", "claimed → finished (nodes, take, finish)"),
                       ("finish_to_seen", "finished → client's poll saw it")):
        print(f"    {label:<44} {_p([r[key] for r in rows], .5):7.2f} ms")
    for node, ms in sorted(nodes.items()):
        print(f"      node {node:<38} {ms:7.2f} ms")
    cpu = {k: (cpu_after[k] - cpu_before[k]) / args.runs * 1000 for k in cpu_before}
    print("  CPU per run (ms): " + ", ".join(f"{k} {v:.2f}" for k, v in cpu.items())
          + f"; total {sum(cpu.values()):.2f}")
    print(f"\nburst: {args.burst} runs from 8 threads by 8 users: "
          f"{acc:.0f} accepted/s, {comp:.0f} completed/s")


if __name__ == "__main__":
    main()
