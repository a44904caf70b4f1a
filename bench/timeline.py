"""Where one hot-path run's wall time goes, round trip by round trip, across the processes.

    DATABASE_URL=… BROKER_URL=… .venv/bin/python bench/timeline.py [--runs 30] [--show 10]

A throwaway farm (as bench/hotpath.py's) whose processes load bench/probe/sitecustomize.py:
every PostgreSQL round trip and Redis command of the web and the worker is stamped. The client
submits bench/hotpath.py's graph `--runs` times, one at a time, 50 ms apart (isolated runs, so
each phase is its own), polling GET /v1/runs/{id} as fast as it answers. Printed: the p50 of each
phase of a run (POST → the web's first query, the submit's queries up to COMMIT, COMMIT → the
broker's LPUSH, the worker's pickup, claim, nodes, finish, the client seeing it), and with
`--show K` the whole timeline of run K. The stamps cost a little: compare phases within a run
of this script, not with bench/hotpath.py's figures.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench._farm import bench_farm  # noqa: E402
from bench.hotpath import _graph, _png, wait_for_worker  # noqa: E402

Row = tuple[float, float, str, str, str, str]  # start, end, pid, thread, kind, what


def record(runs: int, prefix: str) -> None:
    env = {"PYTHONPATH": str(REPO / "bench" / "probe"), "INLINE_PROBE_TIMELINE": prefix}
    with bench_farm(beat=True, extra_env=env) as (farm, token, _models), \
            open(f"{prefix}.client", "w") as out:
        client = httpx.Client(base_url=farm.url, headers={"Authorization": f"Bearer {token}"},
                              timeout=60)
        wait_for_worker(farm.url)
        asset = client.post("/v1/assets", files={"file": ("a.png", _png(), "image/png")}
                            ).json()["id"]
        for n in range(runs + 20):  # the first 20 warm every process up and are not kept
            start = time.time()
            run_id = client.post("/v1/runs", json=_graph(asset, n)).json()["runId"]
            if n >= 20:
                out.write(f"{start:.6f} {time.time():.6f} client client POST {run_id}\n")
            while True:
                start = time.time()
                status = client.get(f"/v1/runs/{run_id}").json()["status"]
                if n >= 20:
                    out.write(f"{start:.6f} {time.time():.6f} client client GET {status}\n")
                if status in ("succeeded", "failed"):
                    break
            time.sleep(0.05)


def load(prefix: str) -> list[Row]:
    rows: list[Row] = []
    for path in Path(prefix).parent.glob(Path(prefix).name + ".*"):
        for line in path.read_text().splitlines():
            start, end, pid, thread, kind, *what = line.split(" ", 5)
            rows.append((float(start), float(end), pid, thread, kind, " ".join(what)))
    return sorted(rows)


def phases(run: list[Row]) -> dict[str, float]:
    """The phases of one run's rows (the first is its POST); StopIteration or IndexError for a
    run of another shape."""
    post = run[0]
    web = [r for r in run if r[3].startswith("http") and r[4] == "pg"]
    lpush = next(r for r in run if r[4] == "redis>" and "LPUSH" in r[5])
    commit = [r for r in web if r[1] <= lpush[0] and r[5] in ("SYNC", "COMMIT")][-1]
    got = next(r for r in run if r[4] == "redis<" and r[0] > lpush[0] and "b'cpu'" in r[5])
    slot = [r for r in run if r[2] == got[2] and r[4] == "pg" and r[0] > got[1]]
    claim = next(r for r in slot if "WITH claimed" in r[5])
    finish = next(r for r in slot if "finished_at = now()" in r[5] or "WITH held" in r[5])
    done = next(r for r in slot if r[3] == finish[3] and r[5] == "COMMIT" and r[0] > finish[1])
    seen = next(r for r in run if r[4] == "GET" and "succeeded" in r[5])
    return {
        "POST → the web's first query": web[0][0] - post[0],
        "the submit's queries → COMMIT": commit[1] - web[0][0],
        "COMMIT → LPUSH": lpush[0] - commit[1],
        "LPUSH → the worker has it": got[1] - lpush[0],
        "the worker has it → claim": claim[0] - got[1],
        "claim": claim[1] - claim[0],
        "claimed → finish starts (nodes)": finish[0] - claim[1],
        "finish → its COMMIT": done[1] - finish[0],
        "COMMIT → the client's poll saw it": seen[1] - done[1],
        "total": seen[1] - post[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--show", type=int, default=None, help="print run K's whole timeline")
    args = parser.parse_args()
    prefix = str(Path(tempfile.mkdtemp(prefix="bench-timeline-")) / "t")
    record(args.runs, prefix)
    rows = load(prefix)
    posts = [i for i, r in enumerate(rows) if r[4] == "POST"]
    runs = [rows[a:b] for a, b in zip(posts, [*posts[1:], len(rows)], strict=True)]
    measured: dict[str, list[float]] = {}
    for run in runs:
        try:
            for name, seconds in phases(run).items():
                measured.setdefault(name, []).append(seconds * 1000)
        except (StopIteration, IndexError):
            continue  # a run whose messages another pass published: not this shape
    print(f"\nhot-path timeline, {len(measured.get('total', []))} of {len(runs)} isolated runs "
          f"(p50 / min, ms):")
    for name, values in measured.items():
        print(f"  {name:<38} {statistics.median(values):7.2f} / {min(values):6.2f}")
    if args.show is not None and args.show < len(runs):
        run = runs[args.show]
        print(f"\nrun {args.show} (ms from its POST; duration; pid; thread; kind; what):")
        for start, end, pid, thread, kind, what in run:
            print(f"  {(start - run[0][0]) * 1000:7.2f} {(end - start) * 1000:6.2f} {pid:>6} "
                  f"{thread:<14} {kind:<6} {what[:80]}")
    print(f"\nstamps in {Path(prefix).parent}")



if __name__ == "__main__":
    main()
