"""`./farm check`: the go-live checklist, run against a live farm over /v1.

Each check renders real work on the farm and says pass or fail with the figures it measured:
- reproducible: one graph and seed rendered by several runs at once (spread over the live
  workers' slots) gives the same image on every worker;
- isolated: runs rendered side by side (sharing forwards) match, pixel for pixel within one
  level of rounding, the same renders made alone;
- overload: a user past their in-flight limit gets 429 with Retry-After, and the farm stays
  healthy;
- memory: per model family the workers hold, one render alone at the check's size: the
  worker's peak memory while it ran (the run's `peakMemoryBytes`, the VAE decode included; on a
  CPU worker counted above the process's memory at its start) within the farm's estimate for
  it (`estimatedMemoryGb`, what routing compares with a worker's VRAM);
- cancel: a run cancelled mid-way ends `cancelled`, the worker's memory is back within 5% of
  what it was before the run, and its slot takes the next run;
- failover (only with `--destructive`, a staff token, and the worker on this host): a worker
  SIGKILLed mid-run; the run finishes on another worker (or the restarted one) exactly once.

With `--gpu`, the CUDA paths too:
- cuda: the live workers on real CUDA cards (a simulated card, INLINE_GPU_DESCRIPTION, does not
  count; none is a failure: `--gpu` asks for them) compute in bfloat16 or float16; one seed
  rendered on every one of their slots gives a real image (no NaN-black or flat frame: the
  failure a half-precision overflow shows) and one image per card type and dtype, a worker that
  offloads weights to the CPU included (offload moves weights, not arithmetic);
- group: every multi-GPU split a live worker group serves (`xfuser.<n>`) renders one seed as
  the same graph on one device renders it (within one level of 8-bit rounding).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from inline_farm.remote import TERMINAL, Farm, FarmError
from inline_farm.terminal import console, model_files, prompt_graph

MEMORY_BACK_FRACTION = 0.05  # after a cancel, the worker's memory within 5% of before the run


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
    checks: list[Callable[[Setup], Check]] = [reproducible, isolated, memory, cancel, overload]
    if args.destructive:
        checks.append(failover)
    if args.gpu:
        checks += [cuda, group]
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {c.__name__ for c in [*checks, failover, cuda, group]}
        if unknown:
            raise FarmError(f"--only: no check named {', '.join(sorted(unknown))}")
        flags = {"failover": "--destructive", "cuda": "--gpu", "group": "--gpu"}
        unasked = sorted(wanted - {c.__name__ for c in checks})
        if unasked:
            raise FarmError("--only: " + ", ".join(f"{n} needs {flags[n]}" for n in unasked))
        checks = [c for c in checks if c.__name__ in wanted]
    results = []
    for check in checks:
        console.print(f"checking {check.__name__}…")
        try:
            results.append(check(setup))
        except FarmError as exc:
            results.append(Check(check.__name__, False, f"the farm refused: {exc}"))
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


def memory(setup: Setup) -> Check:
    """Per family held: one render alone; its peak (above the process's start on a CPU worker)
    within the farm's estimate for the run."""
    files_held = setup.farm.call("GET", "/v1/models/files")["files"]
    models: dict[str, str] = {}
    others: dict[str, str] = {}  # families held only in kinds a prompt graph cannot drive
    clips: dict[str, str] = {}  # families whose checkpoints render clips of their own nodes
    for entry in files_held:
        if entry["folder"] == "checkpoints" and entry.get("family") in CLIP_GRAPHS:
            clips.setdefault(entry["family"], entry["name"])
        if entry["folder"] == "diffusion_models" and entry.get("family"):
            if entry.get("variant") in (None, "t2v"):  # Wan's I2V takes a start image
                models.setdefault(entry["family"], entry["name"])
            else:
                others.setdefault(entry["family"], str(entry["variant"]))
    if not models and not others and not clips:
        return Check("memory", None, "n/a: no live worker holds a diffusion model")
    figures, ok = [], True
    for family, variant in sorted(others.items()):
        if family not in models:
            figures.append(f"{family}: skipped (only {variant} models: the check renders from "
                           "a prompt)")
    bodies = {}
    for family, name in sorted(models.items()):
        files = model_files(setup.farm, name)
        graph = _graph(setup, seed=setup.seed + 300, files=files)
        if _video_family(family):
            graph = _as_video(graph)
        bodies[family] = graph
    for family, name in sorted(clips.items()):
        bodies.setdefault(family, CLIP_GRAPHS[family](setup, name))
    for family, graph in bodies.items():
        body = _labelled(graph, f"check memory {family}")
        run = _render_all(setup.farm, [body])[0]
        if run["status"] != "succeeded":
            return Check("memory", False, f"{family}: the run {run['status']}: {run.get('error')}")
        peak, estimate = run.get("peakMemoryBytes"), run.get("estimatedMemoryGb")
        worker = _worker(setup.farm, run["worker"]) or {}
        report = worker.get("memory") or {}
        if peak is None or estimate is None or not report:
            return Check("memory", None, f"n/a: {run['worker'] or 'the worker'} reports no "
                         "per-run memory (a farm older than this check)")
        used = peak - (int(report["baselineBytes"]) if report["kind"] == "rss" else 0)
        fits = used <= estimate * 1e9
        ok = ok and fits
        figures.append(f"{family}: {used / 1e9:.2f} GB at {setup.size[0]}×{setup.size[1]} "
                       f"({report['kind']}{' above start' if report['kind'] == 'rss' else ''})"
                       f" {'≤' if fits else '>'} estimate {estimate:.2f} GB")
    return Check("memory", ok, "; ".join(figures))


def cancel(setup: Setup) -> Check:
    """A run cancelled mid-way ends `cancelled`, its worker's memory comes back to what it was
    before the run (within 5%), and the slot then renders the next run."""
    before = _memory_by_worker(setup.farm, fresh=True)
    caught = _mid_run(setup, seed=setup.seed + 1, steps=30, label="check cancel")
    if isinstance(caught, str):
        return Check("cancel", False, caught)
    run_id, worker = caught
    asked = time.monotonic()
    setup.farm.cancel(run_id)
    run = _wait(setup.farm, run_id)
    took = time.monotonic() - asked
    after = _memory_by_worker(setup.farm, fresh=True)
    memory_ok, memory_text = True, "its worker's memory: n/a (not reported)"
    if worker in before and worker in after:
        was, now = before[worker], after[worker]
        memory_ok = abs(now - was) <= MEMORY_BACK_FRACTION * was
        memory_text = (f"{worker}'s memory {was / 1e9:.2f} GB before, {now / 1e9:.2f} GB after "
                       f"({(now - was) / was:+.1%})")
    nxt = _render_all(setup.farm, [_labelled(_graph(setup, seed=setup.seed + 2),
                                             "check after cancel")])[0]
    ok = run["status"] == "cancelled" and nxt["status"] == "succeeded" and memory_ok
    return Check("cancel", ok, f"cancelled mid-run: {run['status']} {took:.1f} s after asking; "
                 f"{memory_text}; the next run {nxt['status']}")


def failover(setup: Setup) -> Check:
    """A worker SIGKILLed mid-run: the run finishes elsewhere (another worker, or the one its
    supervisor restarts) exactly once: succeeded, one take, a later attempt."""
    if not any(w.get("pid") is not None for w in setup.farm.workers()):
        # /v1/workers shows pids to staff only: decided before rendering anything
        return Check("failover", None, "n/a: needs a staff token (to see the worker's pid)")
    caught = _mid_run(setup, seed=setup.seed + 3, steps=40, label="check failover")
    if isinstance(caught, str):
        return Check("failover", False, caught)
    run_id, worker = caught
    entry = _worker(setup.farm, worker) or {}
    if entry.get("pid") is None:
        setup.farm.cancel(run_id)
        return Check("failover", None, f"n/a: {worker} reports no pid")
    if entry.get("host") != socket.gethostname():
        setup.farm.cancel(run_id)
        return Check("failover", None, f"n/a: {worker} runs on {entry.get('host')}, not on this "
                     "host: run the check there")
    killed = time.monotonic()
    os.kill(int(entry["pid"]), signal.SIGKILL)
    run = _wait(setup.farm, run_id)
    took = time.monotonic() - killed
    takes = len(run.get("takes") or [])
    ok = run["status"] == "succeeded" and takes == 1 and run["attempts"] >= 2
    return Check("failover", ok, f"killed {worker} (pid {entry['pid']}) mid-run: {run['status']} "
                 f"{took:.1f} s later after {run['attempts']} attempts, {takes} take(s)")


# (image side factor, steps) of the retries when a run ended before it was caught (the sample
# node's most steps: 100); the run is cancelled or killed at step 2, so a long try costs nothing
LONGER = ((2, 100), (4, 100))


def _mid_run(setup: Setup, *, seed: int, steps: int, label: str) -> tuple[str, str] | str:
    """A run of the check's graph (at least `steps` steps) caught at step 2 or later while it
    still runs: (its id, its worker); else why not. A run that ended before it could be caught
    (a small model on a fast card: its events arrive after its end) proves nothing: it is tried
    again at 100 steps (the sample node's most) and twice, then four times the side."""
    for factor, at_least in ((1, steps), *LONGER):
        body = _graph(setup, seed=seed, steps=max(setup.steps, at_least), scale=factor)
        run_id = setup.farm.submit(_labelled(body, label))
        worker, started = "", time.monotonic()
        for event in setup.farm.events(run_id):
            if event["type"] == "status" and event.get("worker"):
                worker = str(event["worker"]).split("#")[0]
            if event["type"] == "progress" and event["step"] >= 2 and worker:
                break
            if time.monotonic() - started > 300:
                setup.farm.cancel(run_id)
                return "the run never reached step 2"
        if setup.farm.run(run_id)["status"] not in TERMINAL:
            return run_id, worker
    return (f"every run ended before the check could act on it (up to {LONGER[-1][1]} steps "
            f"at {LONGER[-1][0]}× the side)")


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


HALF_DTYPES = ("bfloat16", "float16")
FLAT_IMAGE_STD = 2.0  # a take whose pixels vary less than this (8-bit levels) is no image


def cuda(setup: Setup) -> Check:
    """Real CUDA workers compute in half precision and render real, reproducible images."""
    live = setup.farm.workers()
    cards = [w for w in live if str(w["device"].get("device", "")).startswith("cuda")
             and not w["device"].get("simulated")]
    if not cards:
        simulated = sum(1 for w in live if w["device"].get("simulated"))
        return Check("cuda", False, f"no live worker on a CUDA card ({len(live)} live, "
                     f"{simulated} of them simulated): --gpu checks the CUDA paths on one")
    full = [w["name"] for w in cards if w["device"].get("dtype") not in HALF_DTYPES]
    if full:
        return Check("cuda", False, f"{', '.join(full)} compute in full precision on a CUDA card "
                     "(INLINE_DTYPE): the farm's CUDA path is bfloat16")
    kind = {w["name"]: (str(w["device"].get("device_name")), str(w["device"]["dtype"]))
            for w in cards}
    offloading = sorted(w["name"] for w in cards if w["device"].get("cpu_offload"))
    body = _graph(setup, seed=setup.seed + 400)
    runs = _render_all(setup.farm, [_labelled(body, f"check cuda {i}")
                                    for i in range(4 * len(cards) + 1)])
    failed = [r for r in runs if r["status"] != "succeeded"]
    if failed:
        return Check("cuda", False, f"{len(failed)} of {len(runs)} runs {failed[0]['status']}: "
                     f"{failed[0].get('error')}")
    on_cards = [r for r in runs if r["worker"] in kind]
    if not on_cards:
        return Check("cuda", False, f"none of {len(runs)} runs landed on a CUDA worker")
    flat = [(r["worker"], std) for r in on_cards
            if (std := _pixel_std(setup.farm, r["takes"][0])) < FLAT_IMAGE_STD]
    if flat:
        return Check("cuda", False, f"{flat[0][0]} rendered a flat image (pixel std "
                     f"{flat[0][1]:.2f}): NaN or overflow in {kind[flat[0][0]][1]}")
    worst, pair = 0, ("", "")
    first_of: dict[tuple[str, str], dict[str, Any]] = {}
    for run in on_cards:
        first = first_of.setdefault(kind[run["worker"]], run)
        diff = _max_pixel_diff(setup.farm, first["takes"][0], run["takes"][0])
        if diff > worst:
            worst, pair = diff, (first["worker"], run["worker"])
    workers = sorted({r["worker"] for r in on_cards})
    figures = (f"{len(on_cards)} runs on {len(workers)} CUDA worker(s) "
               f"({', '.join(f'{w}: {kind[w][0]} {kind[w][1]}' for w in workers)}); "
               f"offloading: {', '.join(offloading) or 'none'}; max pixel difference per card "
               f"type {worst}")
    if worst > 1:
        return Check("cuda", False, f"{figures} (> 1, between {pair[0]} and {pair[1]})")
    return Check("cuda", True, figures)


def group(setup: Setup) -> Check:
    """Each split a live group serves renders what one device renders."""
    splits = sorted({int(q.split(".", 1)[1]) for w in setup.farm.workers()
                     for q in w["queues"] if q.startswith("xfuser.")})
    if not splits:
        return Check("group", None, "n/a: no live worker group (xfuser.<n> queue)")
    figures, ok = [], True
    for n in splits:
        seed = setup.seed + 500 + n
        split, alone = _render_all(setup.farm, [
            _labelled(_graph(setup, seed=seed, parallel=str(n)), f"check group {n}"),
            _labelled(_graph(setup, seed=seed, parallel="off"), f"check group {n} alone")])
        if split["status"] != "succeeded" or alone["status"] != "succeeded":
            return Check("group", False, f"xfuser.{n}: split {split['status']}, alone "
                         f"{alone['status']}: {split.get('error') or alone.get('error')}")
        diff = _max_pixel_diff(setup.farm, split["takes"][0], alone["takes"][0])
        ok = ok and diff <= 1
        figures.append(f"xfuser.{n} on {split['worker']} vs one device on {alone['worker']}: "
                       f"max pixel difference {diff}")
    return Check("group", ok, "; ".join(figures))


# --- helpers -----------------------------------------------------------------------------------


def _graph(setup: Setup, *, seed: int, steps: int | None = None, parallel: str | None = None,
           files: dict[str, str] | None = None, scale: int = 1) -> dict[str, Any]:
    width, height = (side * scale for side in setup.size)
    body = prompt_graph(prompt="a lighthouse on a cliff at dusk, go-live check", negative="",
                        files=files or setup.files, width=width, height=height,
                        steps=steps or setup.steps, seed=seed, guidance=None, image_asset=None,
                        strength=1.0)
    if parallel:
        body["graph"]["nodes"]["sample"]["params"]["parallel"] = parallel
    return body


VIDEO_FRAMES = 5  # a video family's memory check renders a short clip (1 + 4k frames)


def _video_family(family: str) -> bool:
    from workers.models.families import REGISTERED, info  # torch-free

    return family in REGISTERED and info(family).video


def _as_video(body: dict[str, Any]) -> dict[str, Any]:
    """A prompt graph as a video family's: an empty clip latent, its decode into frames, and
    the last frame saved (the memory of a clip's render, without the video nodes)."""
    out = json.loads(json.dumps(body))
    nodes = out["graph"]["nodes"]
    size = nodes["latent"]["params"]
    nodes["latent"] = {"type": "latent/empty-video",
                       "params": {**size, "length": VIDEO_FRAMES, "batch": 1}}
    nodes["decode"]["type"] = "vae/decode-video"
    nodes["still"] = {"type": "frames/image", "params": {"index": -1},
                      "inputs": {"frames": {"node": "decode", "port": "frames"}}}
    nodes["save"]["inputs"]["image"] = {"node": "still", "port": "image"}
    return out


def _ltx2_clip(setup: Setup, checkpoint: str) -> dict[str, Any]:
    """An LTX-2 checkpoint's clip at the check's size (sides rounded to its 32-pixel grid),
    VIDEO_LTX2_FRAMES frames with sound, saved as an MP4 (STG off: its block differs per model
    size)."""
    width, height = (max(32, round(side / 32) * 32) for side in setup.size)

    def wire(node: str, port: str) -> dict[str, str]:
        return {"node": node, "port": port}

    return {"graph": {"nodes": {
        "ckpt": {"type": "load/checkpoint", "params": {"file": checkpoint}},
        "pos": {"type": "encode/text", "params": {"text": "a lighthouse at dusk, go-live check"},
                "inputs": {"encoder": wire("ckpt", "encoder")}},
        "latent": {"type": "ltx2/empty-latent", "params": {
            "width": width, "height": height, "length": VIDEO_LTX2_FRAMES, "fps": 24.0}},
        "sample": {"type": "ltx2/sample", "params": {
            "seed": setup.seed + 300, "steps": setup.steps, "stg": 0.0, "audio_stg": 0.0},
            "inputs": {"model": wire("ckpt", "model"), "positive": wire("pos", "conditioning"),
                       "latent": wire("latent", "latent")}},
        "decode": {"type": "ltx2/decode", "inputs": {"vae": wire("ckpt", "vae"),
                                                     "latent": wire("sample", "latent")}},
        "save": {"type": "video/save", "params": {},
                 "inputs": {"video": wire("decode", "video")}},
    }}, "target": "save"}


VIDEO_LTX2_FRAMES = 9  # LTX-2's shortest clip with motion (8k + 1 frames)


def _minimaxh3_clip(setup: Setup, checkpoint: str) -> dict[str, Any]:
    """A MiniMax-H3 checkpoint's shortest clip (5 s: VIDEO_H3_FRAMES) with sound at the check's
    size (sides rounded to its 32-pixel grid), at most VIDEO_H3_STEPS steps (its memory does not
    grow with them), saved as an MP4."""
    width, height = (max(32, round(side / 32) * 32) for side in setup.size)

    def wire(node: str, port: str) -> dict[str, str]:
        return {"node": node, "port": port}

    return {"graph": {"nodes": {
        "ckpt": {"type": "load/checkpoint", "params": {"file": checkpoint}},
        "request": {"type": "minimaxh3/image-to-video", "params": {
            "prompt": "a lighthouse at dusk, go-live check", "width": width, "height": height,
            "length": VIDEO_H3_FRAMES},
            "inputs": {"encoder": wire("ckpt", "encoder"), "vae": wire("ckpt", "vae")}},
        "sample": {"type": "minimaxh3/sample", "params": {
            "seed": setup.seed + 300, "steps": min(setup.steps, VIDEO_H3_STEPS)},
            "inputs": {"model": wire("ckpt", "model"), "positive": wire("request", "positive"),
                       "latent": wire("request", "latent")}},
        "decode": {"type": "minimaxh3/decode", "inputs": {"vae": wire("ckpt", "vae"),
                                                          "latent": wire("sample", "latent")}},
        "save": {"type": "video/save", "params": {},
                 "inputs": {"video": wire("decode", "video")}},
    }}, "target": "save"}


VIDEO_H3_FRAMES = 124  # MiniMax-H3's shortest clip: 17·7 + 5 frames, 5.17 s at 24 fps
VIDEO_H3_STEPS = 2
# families held as checkpoints whose clip graphs are their own nodes: the memory check's graph
CLIP_GRAPHS: dict[str, Callable[[Setup, str], dict[str, Any]]] = {"ltx2": _ltx2_clip,
                                                                  "minimaxh3": _minimaxh3_clip}


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


def _pixels(farm: Farm, take: dict[str, Any]) -> Any:
    import numpy as np
    from PIL import Image

    data = farm.http.get(f"/v1/takes/{take['id']}/bytes").content
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.int16)


def _max_pixel_diff(farm: Farm, a: dict[str, Any], b: dict[str, Any]) -> int:
    first, second = _pixels(farm, a), _pixels(farm, b)
    if first.shape != second.shape:
        return 255
    return int(abs(first - second).max())


def _pixel_std(farm: Farm, take: dict[str, Any]) -> float:
    return float(_pixels(farm, take).std())


def _worker(farm: Farm, name: str) -> dict[str, Any] | None:
    return next((w for w in farm.workers() if w["name"] == name), None)


def _memory_by_worker(farm: Farm, *, fresh: bool) -> dict[str, int]:
    """Each live worker's memory bytes at its heartbeat; `fresh`: from a heartbeat made after
    this call (each worker's `lastHeartbeat` moved twice: the first may have been under way)."""
    def beats() -> dict[str, str]:
        return {w["name"]: w.get("lastHeartbeat") or "" for w in farm.workers()}

    if fresh:
        seen = [beats()]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(seen) < 3:
            time.sleep(0.25)
            now = beats()
            if all(now.get(n) != seen[-1].get(n) for n in seen[0]):
                seen.append(now)
    return {w["name"]: int(w["memory"]["bytes"]) for w in farm.workers() if w.get("memory")}


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

