"""Farm overhead on generation: submit → take bytes over /v1 vs diffusers' pipeline called directly.

Same tiny random-weight Z-Image stack, same machine, same size/steps/seeds, measured in one run.
The farm path is: HTTP submit (validate, store, dispatch) → broker → worker claim → executor →
runner → PNG take → the run's websocket reports `run_done` → HTTP GET of the bytes, as a Studio
client watches a render (polling would steal CPU from the worker on a small machine). Seeds vary
per iteration so the worker's node cache never answers. Farm and direct runs alternate, one of
each per iteration, so a machine that speeds up or slows down mid-run moves both alike. Then,
from the farm's own records, where its runs' time went: created → started, each node
(`zimage/turbo` is the direct call's work), started → finished.

    DATABASE_URL=… BROKER_URL=… .venv/bin/python bench/generate.py [--runs 20] [--size 256]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import httpx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._farm import bench_farm, wait_for_model, wait_run_done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()

    with bench_farm() as (farm, token, models_dir):
        from workers.models.zimage.tiny import smoke_pipeline, write_smoke_stack

        names = write_smoke_stack(models_dir)
        client = httpx.Client(base_url=farm.url, headers={"Authorization": f"Bearer {token}"},
                              timeout=120)
        wait_for_model(client, names["model"])
        graph = _graph(names, args.size, args.steps)
        _farm_once(client, graph, seed=10_000)  # warm: model load, first forward
        pipe = smoke_pipeline()
        _direct_once(pipe, args.size, args.steps, seed=10_000)
        farm_ms: list[float] = []
        direct_ms: list[float] = []
        run_ids: list[str] = []
        for i in range(args.runs):
            farm_ms.append(_farm_once(client, graph, seed=i, run_ids=run_ids))
            direct_ms.append(_direct_once(pipe, args.size, args.steps, seed=i))
        inside = _inside(farm.env["DATABASE_URL"], run_ids)

    f50, d50 = statistics.median(farm_ms), statistics.median(direct_ms)
    print(f"bench/generate: tiny Z-Image stack, {args.size}x{args.size}, {args.steps} steps, "
          f"{args.runs} runs each, alternating, CPU ({torch.get_num_threads()} threads)")
    print(f"  diffusers pipeline direct : p50 {d50:8.1f} ms   mean {statistics.mean(direct_ms):8.1f} ms")
    print(f"  farm submit → take bytes  : p50 {f50:8.1f} ms   mean {statistics.mean(farm_ms):8.1f} ms")
    print(f"  farm overhead             : p50 {f50 - d50:8.1f} ms   ratio farm/direct {f50 / d50:.2f}x")
    paired = statistics.median(f - d for f, d in zip(farm_ms, direct_ms, strict=True))
    print(f"  per pair (farm − the direct run after it): p50 {paired:8.1f} ms")
    print("  inside the farm (its runs' timestamps and node_done events, p50):")
    for name, ms in inside.items():
        print(f"    {name:<38} {ms:8.1f} ms")
    node = inside.get("node zimage/turbo")
    if node is not None:  # the direct call's work inside the farm: what the farm adds around it
        print(f"  farm p50 − its zimage/turbo node's p50: {f50 - node:8.1f} ms (the farm's path "
              f"around the generation; the overhead above also carries node − direct "
              f"{node - d50:+.1f} ms)")


def _graph(names: dict[str, str], size: int, steps: int) -> dict:
    return {"graph": {"nodes": {
        "gen": {"type": "zimage/turbo", "params": {
            "prompt": "a lighthouse at dusk", "width": size, "height": size, "steps": steps,
            "model": names["model"], "vae": names["vae"], "text_encoder": names["text_encoder"]}},
        "out": {"type": "image/save", "inputs": {"image": {"node": "gen", "port": "image"}}},
    }}, "target": "out"}


def _farm_once(client: httpx.Client, graph: dict, seed: int,
               run_ids: list[str] | None = None) -> float:
    graph["graph"]["nodes"]["gen"]["params"]["seed"] = seed
    start = time.perf_counter()
    run_id = client.post("/v1/runs", json=graph).raise_for_status().json()["runId"]
    if run_ids is not None:
        run_ids.append(run_id)
    done = wait_run_done(client, run_id)
    if done["status"] != "succeeded":
        raise SystemExit(f"run failed: {done['error']}")
    client.get(f"/v1/takes/{done['takes'][0]['id']}/bytes").raise_for_status()
    return (time.perf_counter() - start) * 1000


def _inside(database_url: str, run_ids: list[str]) -> dict[str, float]:
    """Where a farm run's time went by the farm's own records: created → started (dispatch,
    broker, claim), each node (`node_done`'s ms: `zimage/turbo` is the same work as the direct
    call, `image/save` the PNG the direct call does not make), started → finished."""
    import psycopg

    with psycopg.connect(database_url) as conn:
        runs = conn.execute("SELECT created_at, started_at, finished_at FROM runs_run "
                            "WHERE id = ANY(%s::uuid[])", [run_ids]).fetchall()
        events = conn.execute("SELECT payload FROM runs_runevent WHERE type = 'node_done' "
                              "AND run_id = ANY(%s::uuid[])", [run_ids]).fetchall()
    per: dict[str, list[float]] = {}
    for (payload,) in events:
        per.setdefault(f"node {payload['nodeType']}", []).append(payload["ms"])
    out = {"created → started": statistics.median(
        (s - c).total_seconds() * 1000 for c, s, _ in runs)}
    out.update({name: statistics.median(ms) for name, ms in per.items()})
    out["started → finished"] = statistics.median(
        (f - s).total_seconds() * 1000 for _, s, f in runs)
    return out


def _direct_once(pipe, size: int, steps: int, seed: int) -> float:
    start = time.perf_counter()
    pipe("a lighthouse at dusk", width=size, height=size, num_inference_steps=steps,
         guidance_scale=0.0, generator=torch.Generator("cpu").manual_seed(seed)).images[0]
    return (time.perf_counter() - start) * 1000


if __name__ == "__main__":
    main()
