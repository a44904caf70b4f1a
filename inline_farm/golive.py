"""`./farm check`: the go-live checklist, run against a live farm over /v1.

Each check renders real work on the farm and says pass or fail with the figures it measured:
- reproducible: one graph and seed rendered by several runs at once (spread over the live
  workers' slots) gives the same image on every worker;
- isolated: runs rendered side by side (sharing forwards) match, pixel for pixel within one
  level of rounding, the same renders made alone;
- overload: a user past their in-flight limit gets 429 with Retry-After, and the farm stays
  healthy;
- cancel: a run cancelled mid-way ends `cancelled` and its slot takes the next run.
Memory figures per family (peak including the VAE decode, memory back after a cancel) need a
per-run memory report from the workers, which they do not make yet: the check says so (`n/a`)
rather than pass.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from inline_farm.remote import TERMINAL, Farm, FarmError
from inline_farm.terminal import console, model_files, prompt_graph


@dataclass
class Check:
    """One line of the checklist: `ok` None means it could not be measured here."""

    name: str
    ok: bool | None
    figures: str


@dataclass
class Setup:
    farm: Farm
    files: dict[str, str]
    size: tuple[int, int]
    steps: int
    burst_bound: int
    seed: int


def cmd_check(args: argparse.Namespace, farm: Farm) -> int:
    # Seeds of their own each time: a check run again on the same farm must render afresh,
    # not be answered by the workers' node caches.
    setup = Setup(farm=farm, files=model_files(farm, args.model), size=args.size,
                  steps=args.steps, burst_bound=args.burst,
                  seed=random.randint(0, 2**40))
    checks: list[Callable[[Setup], Check]] = [reproducible, isolated, cancel, overload]
    results = []
    for check in checks:
        console.print(f"checking {check.__name__}…")
        try:
            results.append(check(setup))
        except FarmError as exc:
            results.append(Check(check.__name__, False, f"the farm refused: {exc}"))
    results.append(Check("memory", None, "n/a: workers report no per-run peak memory yet"))
    if args.json:
        print(json.dumps([asdict(r) for r in results]))
    else:
        _table(results)
    return 1 if any(r.ok is False for r in results) else 0


def _table(results: list[Check]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table("check", "result", "figures")
    marks = {True: "[green]pass", False: "[red]FAIL", None: "[yellow]n/a"}
    for r in results:
        table.add_row(r.name, marks[r.ok], r.figures)
    Console().print(table)


# --- the checks --------------------------------------------------------------------------------


def reproducible(setup: Setup) -> Check:
    """One seed rendered by as many runs at once as the live workers have slots (+1), so that
    every worker renders it: one image, within one level of 8-bit rounding (runs that share a
    forward round alike only to float precision; and each take's bytes carry its own lineage,
    so images are compared by their pixels)."""
    copies = min(16, _live_slots(setup.farm) + 1)
    bodies = [_labelled(_graph(setup, seed=setup.seed), f"check reproducible {i}") for i in range(copies)]
    runs = _render_all(setup.farm, bodies)
    failed = [r for r in runs if r["status"] != "succeeded"]
    if failed:
        return Check("reproducible", False, f"{len(failed)} of {copies} runs {failed[0]['status']}: "
                     f"{failed[0].get('error')}")
    first = runs[0]
    diffs = [(_max_pixel_diff(setup.farm, first["takes"][0], r["takes"][0]), r) for r in runs[1:]]
    worst, other = max(diffs, key=lambda d: d[0])
    workers = sorted({r["worker"] for r in runs})
    if worst > 1:
        return Check("reproducible", False, f"different images of one seed: max pixel "
                     f"difference {worst} between runs on {first['worker']} and {other['worker']}")
    return Check("reproducible", True, f"{copies} runs on {len(workers)} worker(s) "
                 f"({', '.join(workers)}): max pixel difference {worst}")


def isolated(setup: Setup, count: int = 8) -> Check:
    """Runs side by side match their solo renders (within one level of 8-bit rounding)."""
    seeds = range(setup.seed + 100, setup.seed + 100 + count)
    # The solo renders differ from the side-by-side ones only in `parallel` ("off": placement,
    # never pixels), so a worker's node cache, keyed by params, cannot answer one from the other.
    solo = [_render_all(setup.farm, [_graph(setup, seed=s, parallel="off")])[0] for s in seeds]
    together = _render_all(setup.farm, [_graph(setup, seed=s) for s in seeds])
    cached = [r["id"] for r in solo + together if r["sampleCached"]]
    if cached:
        return Check("isolated", False, f"the node cache answered {len(cached)} runs: nothing "
                     "was compared")
    if any(r["status"] != "succeeded" for r in solo + together):
        return Check("isolated", False, "a run did not succeed")
    worst = max(_max_pixel_diff(setup.farm, a["takes"][0], b["takes"][0])
                for a, b in zip(solo, together, strict=True))
    batched = max(r["batch"] for r in together)
    ok = worst <= 1
    return Check("isolated", ok, f"{count} runs side by side (largest batch {batched}) vs alone: "
                 f"max pixel difference {worst}" + ("" if ok else " (> 1)"))


def cancel(setup: Setup) -> Check:
    """A run cancelled mid-way ends `cancelled`; the slot then renders the next run."""
    body = _graph(setup, seed=setup.seed + 1, steps=max(setup.steps, 30))
    run_id = setup.farm.submit(_labelled(body, "check cancel"))
    started = time.monotonic()
    for event in setup.farm.events(run_id):
        if event["type"] == "progress" and event["step"] >= 2:
            break
        if time.monotonic() - started > 300:
            return Check("cancel", False, "the run never reached step 2")
    asked = time.monotonic()
    setup.farm.cancel(run_id)
    run = _wait(setup.farm, run_id)
    took = time.monotonic() - asked
    after = _render_all(setup.farm, [_labelled(_graph(setup, seed=setup.seed + 2), "check after cancel")])[0]
    ok = run["status"] == "cancelled" and after["status"] == "succeeded"
    return Check("cancel", ok, f"cancelled mid-run: {run['status']} {took:.1f} s after asking; "
                 f"the next run {after['status']}")


def overload(setup: Setup) -> Check:
    """Past the caller's in-flight limit: 429 with Retry-After, and the farm still healthy."""
    asset = setup.farm.call("POST", "/v1/assets",
                            files={"file": ("check.png", _png(), "image/png")})
    submitted: list[str] = []
    refusal: FarmError | None = None
    retry_after = None
    try:
        for i in range(setup.burst_bound):
            response = setup.farm.http.post("/v1/runs", json=_delay_graph(asset["id"], i))
            if response.status_code == 429:
                retry_after = response.headers.get("Retry-After")
                refusal = FarmError("429")
                break
            if response.status_code >= 400:
                return Check("overload", False, f"HTTP {response.status_code} before any 429: "
                             f"{response.text[:200]}")
            submitted.append(response.json()["runId"])
        health = setup.farm.http.get("/v1/health")
    finally:
        for run_id in submitted:
            setup.farm.cancel(run_id)
    if refusal is None:
        return Check("overload", False, f"no 429 after {len(submitted)} runs in flight: is the "
                     "per-user limit off?")
    ok = bool(retry_after) and health.status_code == 200
    return Check("overload", ok, f"429 after {len(submitted)} runs in flight, Retry-After "
                 f"{retry_after or 'missing'}; health {health.status_code}")


# --- helpers -----------------------------------------------------------------------------------


def _graph(setup: Setup, *, seed: int, steps: int | None = None,
           parallel: str | None = None) -> dict[str, Any]:
    width, height = setup.size
    body = prompt_graph(prompt="a lighthouse on a cliff at dusk, go-live check", negative="",
                        files=setup.files, width=width, height=height,
                        steps=steps or setup.steps, seed=seed, guidance=None, image_asset=None,
                        strength=1.0)
    if parallel:
        body["graph"]["nodes"]["sample"]["params"]["parallel"] = parallel
    return body


def _labelled(body: dict[str, Any], label: str) -> dict[str, Any]:
    out = json.loads(json.dumps(body))
    out["graph"]["nodes"]["save"]["params"]["label"] = label
    return out


def _render_all(farm: Farm, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Submit every body at once, follow each to its end; the runs with `worker` (who ran it),
    `batch` (the largest shared forward) and `sampleCached` added."""
    run_ids = [farm.submit(b) for b in bodies]
    seen: dict[str, dict[str, Any]] = {r: {"worker": "", "batch": 1, "sampleCached": False}
                                       for r in run_ids}

    def follow(run_id: str) -> None:
        for event in farm.events(run_id):
            if event["type"] == "status" and event.get("worker"):
                seen[run_id]["worker"] = str(event["worker"]).split("#")[0]
            elif event["type"] == "progress":
                seen[run_id]["batch"] = max(seen[run_id]["batch"], event.get("batch") or 1)
            elif event["type"] == "node_done" and event.get("nodeType") == "sample":
                seen[run_id]["sampleCached"] = bool(event.get("cached"))

    threads = [threading.Thread(target=follow, args=(r,), daemon=True) for r in run_ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    return [{**_wait(farm, r), **seen[r]} for r in run_ids]


def _wait(farm: Farm, run_id: str, timeout: float = 600) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        run = farm.run(run_id)
        if run["status"] in TERMINAL or time.monotonic() > deadline:
            return run
        time.sleep(0.2)


def _max_pixel_diff(farm: Farm, a: dict[str, Any], b: dict[str, Any]) -> int:
    import numpy as np
    from PIL import Image

    def pixels(take: dict[str, Any]) -> Any:
        data = farm.http.get(f"/v1/takes/{take['id']}/bytes").content
        return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.int16)

    first, second = pixels(a), pixels(b)
    if first.shape != second.shape:
        return 255
    return int(np.abs(first - second).max())


def _live_slots(farm: Farm) -> int:
    """Slots to fill so that copies land on every live worker (4 a worker: ./farm's default)."""
    return 4 * max(1, len(farm.workers()))


def _delay_graph(asset: str, i: int) -> dict[str, Any]:
    return {"graph": {"nodes": {
        "src": {"type": "image/load", "params": {"asset": asset}},
        "wait": {"type": "util/delay", "params": {"seconds": 30.0},
                 "inputs": {"image": {"node": "src", "port": "image"}}},
        "out": {"type": "image/save", "params": {"label": f"check overload {i}"},
                "inputs": {"image": {"node": "wait", "port": "image"}}},
    }}, "target": "out"}


def _png() -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (16, 16), (10, 20, 30)).save(out, format="PNG")
    return out.getvalue()

