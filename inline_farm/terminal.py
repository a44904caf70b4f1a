"""The farm at a terminal: `./farm render`, `watch`, `runs`, `takes get`, `models ls`.

Everything goes over `/v1` (inline_farm/remote.py), so each command works against the local
farm and a remote one alike. Progress bars are rich's; one per run, fed by the run's events
websocket (step of total, the node, how many runs shared the step's forward, the ETA).
"""

from __future__ import annotations

import argparse
import json
import mimetypes
import random
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)
from rich.prompt import Confirm
from rich.table import Table

from inline_farm.remote import TERMINAL, Farm, FarmError

console = Console(stderr=True)
MAX_SEED = 2**53 - 1


# --- graphs ------------------------------------------------------------------------------------


def prompt_graph(*, prompt: str, negative: str, files: dict[str, str], width: int, height: int,
                 steps: int, seed: int, guidance: float | None, image_asset: str | None,
                 strength: float, loras: Sequence[tuple[str, float, float]] = ()
                 ) -> dict[str, Any]:
    """A text-to-image graph of the generic nodes (img2img with `image_asset`), for whichever
    family the model files are; `files["checkpoint"]`: one all-in-one file (SDXL's) loads the
    model, encoder and VAE. `loras`: (file, strength, strength_clip) of a chain of `load/lora`
    nodes (`lora1`, …) between the loaders and the sampler and encodes."""
    nodes, encoder, vae = _loaders(files)
    model = {"node": "model", "port": "model"}
    for index, (name, weight, weight_clip) in enumerate(loras, start=1):
        node = f"lora{index}"
        nodes[node] = {"type": "load/lora", "inputs": {"model": model, "encoder": dict(encoder)},
                       "params": {"lora": name, "strength": weight,
                                  "strength_clip": weight_clip}}
        model, encoder = {"node": node, "port": "model"}, {"node": node, "port": "encoder"}
    nodes |= {
        "positive": {"type": "encode/text", "params": {"text": prompt},
                     "inputs": {"encoder": dict(encoder)}},
        "decode": {"type": "vae/decode", "inputs": {"vae": dict(vae),
                                                    "latent": {"node": "sample", "port": "latent"}}},
        "save": {"type": "image/save", "params": {"label": prompt[:200]},
                 "inputs": {"image": {"node": "decode", "port": "image"}}},
    }
    sample: dict[str, Any] = {"seed": seed, "steps": steps}
    inputs: dict[str, Any] = {"model": model,
                              "positive": {"node": "positive", "port": "conditioning"},
                              "latent": {"node": "latent", "port": "latent"}}
    if guidance is not None:
        sample["guidance"] = guidance
    if negative:
        nodes["negative"] = {"type": "encode/text", "params": {"text": negative},
                             "inputs": {"encoder": dict(encoder)}}
        inputs["negative"] = {"node": "negative", "port": "conditioning"}
    if image_asset:
        nodes["image"] = {"type": "image/load", "params": {"asset": image_asset}}
        nodes["resized"] = {"type": "image/resize", "params": {"width": width, "height": height},
                            "inputs": {"image": {"node": "image", "port": "image"}}}
        nodes["latent"] = {"type": "vae/encode", "inputs": {
            "vae": dict(vae), "image": {"node": "resized", "port": "image"}}}
        sample["denoise"] = strength
    else:
        nodes["latent"] = {"type": "latent/empty", "params": {"width": width, "height": height}}
    nodes["sample"] = {"type": "sample", "params": sample, "inputs": inputs}
    return {"graph": {"nodes": nodes}, "target": "save"}


def _loaders(files: dict[str, str]) -> tuple[dict[str, Any], dict[str, str], dict[str, str]]:
    """The loader nodes (the model's is `model`), and where the text encoder and VAE come from."""
    if "checkpoint" in files:  # one file: its outputs are the model, the encoder and the VAE
        nodes = {"model": {"type": "load/checkpoint", "params": {"file": files["checkpoint"]}}}
        return nodes, {"node": "model", "port": "encoder"}, {"node": "model", "port": "vae"}
    second = {"file_2": files["text_encoder_2"]} if "text_encoder_2" in files else {}
    # whose encoder it is, when the file is more than one family's (a Qwen3: Z-Image's and
    # FLUX.2 Klein's)
    family = {"family": files["family"]} if "family" in files else {}
    nodes = {
        "model": {"type": "load/diffusion-model", "params": {"file": files["model"]}},
        "encoder": {"type": "load/text-encoder",
                    "params": {"file": files["text_encoder"], **second, **family}},
        "vae": {"type": "load/vae", "params": {"file": files["vae"]}},
    }
    return nodes, {"node": "encoder", "port": "encoder"}, {"node": "vae", "port": "vae"}


def with_seed(body: dict[str, Any], seed: int) -> dict[str, Any]:
    """`body` (a graph and target) with every node's `seed` param set to `seed`."""
    out = json.loads(json.dumps(body))
    for node in out["graph"]["nodes"].values():
        if "seed" in (node.get("params") or {}):
            node["params"]["seed"] = seed
    return out


def _first_prompt_model(names: list[str], files_held: list[dict[str, Any]]) -> str:
    """The first of `names` a prompt graph of images drives: not a video family's model, nor a
    kind that needs more than a prompt (Wan's I2V); the first of all when none is."""
    from workers.models.families import REGISTERED, info  # torch-free

    entries = {e["name"]: e for e in files_held if e["folder"] == "diffusion_models"}

    def plain(name: str) -> bool:
        entry = entries.get(name, {})
        family = entry.get("family")
        video = family in REGISTERED and info(family).video
        return not video and entry.get("variant") in (None, "t2v")

    return next((n for n in names if plain(n)), names[0])


def model_files(farm: Farm, model: str | None) -> dict[str, str]:
    """The diffusion model (`model`, or the first a live worker holds) and a text encoder and a
    VAE to go with it, from the files the farm's live workers hold, and the model's `family`
    when the farm names it; or `{"checkpoint"}`: the all-in-one file `model` names (or the
    first, when no worker holds a diffusion model)."""
    def choices(node_type: str) -> list[str]:
        params = farm.descriptor(node_type)["params"]
        return list(next(p for p in params if p["name"] == "file").get("choices") or [])

    checkpoints = choices("load/checkpoint")
    if checkpoints and (model in checkpoints
                        or (model is None and not choices("load/diffusion-model"))):
        return {"checkpoint": model or checkpoints[0]}
    held = {role: choices(node) for role, node in (("model", "load/diffusion-model"),
                                                    ("text_encoder", "load/text-encoder"),
                                                    ("vae", "load/vae"))}
    for role, names in held.items():
        if not names:
            raise FarmError(f"no live worker holds a {role.replace('_', ' ')} file: put one in "
                            "the models dir (./farm models smoke writes a tiny test stack)")
    if model is not None and model not in held["model"]:
        raise FarmError(f"no live worker holds the model {model!r}; held: "
                        + ", ".join(held["model"]))
    files_held = farm.call("GET", "/v1/models/files")["files"]
    chosen = model or _first_prompt_model(held["model"], files_held)
    families = {(e["folder"], e["name"]): set(e.get("families") or []) for e in files_held}
    family = next((e.get("family") for e in files_held
                   if (e["folder"], e["name"]) == ("diffusion_models", chosen)), None)
    if family is not None:  # only the files of the model's own family (GET /v1/models/files)
        for role, folder in (("text_encoder", "text_encoders"), ("vae", "vae")):
            own = [n for n in held[role] if family in families.get((folder, n), ())]
            held[role] = own or held[role]
    files = {"model": chosen, "vae": _nearest(chosen, held["vae"])}
    if family is not None:
        files["family"] = family
    # A family with two text encoders (FLUX.1's CLIP-L and T5) ships them side by side: the two
    # that share the most of the model's name go as `file` and `file_2`.
    ranked = sorted(held["text_encoder"], key=lambda n: -len(_common(chosen, n)))
    files["text_encoder"] = ranked[0]
    if len(ranked) > 1 and len(_common(chosen, ranked[1])) == len(_common(chosen, ranked[0])):
        files["text_encoder_2"] = ranked[1]
    return files


def _nearest(model: str, names: list[str]) -> str:
    """The name sharing the longest prefix with `model` (a stack's files share its prefix)."""
    return max(names, key=lambda n: (len(_common(model, n)), -names.index(n)))


def _common(a: str, b: str) -> str:
    size = 0
    while size < min(len(a), len(b)) and a[size] == b[size]:
        size += 1
    return a[:size]


# --- following runs ----------------------------------------------------------------------------


class Board:
    """One progress bar per run; each run followed on a thread of its own."""

    def __init__(self, farm: Farm, out_dir: Path | None) -> None:
        self.farm, self.out_dir = farm, out_dir
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[node]}"), TextColumn("{task.fields[batch]}"),
            TimeRemainingColumn(), console=console, transient=False,
        )
        self.finished: dict[str, dict[str, Any]] = {}
        self.files: dict[str, list[Path]] = {}
        self.errors: dict[str, str] = {}

    def follow(self, run_ids: list[str], labels: dict[str, str]) -> None:
        with self.progress:
            threads = [threading.Thread(target=self._follow, args=(run_id, labels.get(run_id, "")),
                                        daemon=True) for run_id in run_ids]
            for t in threads:
                t.start()
            for t in threads:
                while t.is_alive():
                    t.join(0.2)  # a short join: Ctrl-C reaches the main thread at once

    def _follow(self, run_id: str, label: str) -> None:
        task = self.progress.add_task(f"{run_id[:8]} {label}".strip(), total=None, node="queued",
                                      batch="")
        try:
            for event in self.farm.events(run_id):
                self._show(task, event)
            run = self.farm.run(run_id)
            self.finished[run_id] = run
            if run["status"] == "succeeded" and self.out_dir is not None:
                self.files[run_id] = [self.farm.download(t, self.out_dir / take_name(t))
                                      for t in run["takes"]]
            self.progress.update(task, node=_status_text(run), batch="")
        except FarmError as exc:
            self.errors[run_id] = str(exc)
            self.progress.update(task, node=f"[red]{exc}", batch="")

    def _show(self, task: TaskID, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "progress":
            batch = event.get("batch")
            self.progress.update(task, completed=event["step"], total=event["total"],
                                 node=event["nodeId"],
                                 batch=f"batch {batch}" if batch and batch > 1 else "")
        elif kind == "node_done":
            self.progress.update(task, node=f"{event['nodeId']} done")
        elif kind == "status":
            self.progress.update(task, node=str(event.get("status", "")))


def _status_text(run: dict[str, Any]) -> str:
    if run["status"] == "succeeded":
        return "[green]succeeded"
    error = run.get("error") or {}
    message = error.get("message") if isinstance(error, dict) else error
    return f"[red]{run['status']}" + (f": {message}" if message else "")


def take_name(take: dict[str, Any]) -> str:
    """A take's file name: its run, seed, node and index, so a folder of takes reads as such."""
    suffix = mimetypes.guess_extension(take.get("mediaType") or "") or ".bin"
    seed = f"-seed{take['seed']}" if take.get("seed") is not None else ""
    node = "".join(c if c.isalnum() or c in "-_" else "_" for c in str(take.get("nodeId", "")))
    return f"{take['runId'][:8]}{seed}-{node}-{take.get('index', 0)}{suffix}"


def cancel_on_interrupt(farm: Farm, run_ids: list[str], ask: Callable[[str], bool]) -> None:
    """Ctrl-C during a render: cancel the runs it started (asking first when several)."""
    open_runs = [r for r in run_ids if farm.run(r)["status"] not in TERMINAL]
    if not open_runs:
        return
    if len(open_runs) > 1 and not ask(f"Cancel the {len(open_runs)} runs still going?"):
        console.print("runs left going: " + " ".join(open_runs))
        return
    for run_id in open_runs:
        farm.cancel(run_id)
    console.print(f"cancelled {len(open_runs)} run(s)")


# --- commands ----------------------------------------------------------------------------------


def cmd_render(args: argparse.Namespace, farm: Farm) -> int:
    if not (args.prompt or args.graph or args.workflow):
        raise FarmError("say what to render: a prompt, --graph G.json or --workflow W.json")
    out_dir = Path(args.output).expanduser()
    out_dir.mkdir(parents=True, exist_ok=True)
    bodies = _render_bodies(args, farm)
    run_ids, labels = [], {}
    for seed, body in bodies:
        run_id = farm.submit(body)
        run_ids.append(run_id)
        labels[run_id] = f"seed {seed}" if seed is not None else ""
        print(run_id, flush=True)
    board = Board(farm, out_dir)
    try:
        board.follow(run_ids, labels)
    except KeyboardInterrupt:
        cancel_on_interrupt(farm, run_ids, _ask)
        return 130
    return _report(board, run_ids)


def _render_bodies(args: argparse.Namespace, farm: Farm) -> list[tuple[int | None, dict[str, Any]]]:
    first = args.seed if args.seed is not None else random.randint(0, MAX_SEED - args.count)
    seeds = [first + i for i in range(args.count)]
    if args.graph or args.workflow:
        if args.lora:
            raise FarmError("--lora adds LoRAs to a prompt's graph: a --graph or --workflow "
                            "brings its own (load/lora nodes, ComfyUI's LoraLoader)")
        if args.graph:
            body = json.loads(Path(args.graph).read_text())
        else:
            imported = farm.call("POST", "/v1/import/comfy",
                                 content=Path(args.workflow).read_bytes(),
                                 headers={"Content-Type": "application/json"})
            body = {"graph": imported["graph"], "target": imported["target"]}
        if args.count == 1 and args.seed is None:
            return [(None, body)]
        return [(seed, with_seed(body, seed)) for seed in seeds]
    width, height = args.size
    files = model_files(farm, args.model)
    asset = farm.upload(Path(args.image).expanduser()) if args.image else None
    return [(seed, prompt_graph(prompt=args.prompt, negative=args.negative, files=files,
                                width=width, height=height, steps=args.steps, seed=seed,
                                guidance=args.guidance, image_asset=asset,
                                strength=args.strength, loras=args.lora)) for seed in seeds]


def _report(board: Board, run_ids: list[str]) -> int:
    failed = 0
    for run_id in run_ids:
        run = board.finished.get(run_id)
        if run is None or run["status"] != "succeeded":
            failed += 1
            console.print(f"{run_id}: {board.errors.get(run_id) or _status_text(run or {})}")
        for path in board.files.get(run_id, []):
            print(path, flush=True)
    return 1 if failed else 0


def _ask(question: str) -> bool:
    if not console.is_terminal:
        return True
    return Confirm.ask(question, console=console, default=True)


def cmd_watch(args: argparse.Namespace, farm: Farm) -> int:
    out_dir = Path(args.output).expanduser() if args.output else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    board = Board(farm, out_dir)
    try:
        board.follow(args.runs, {})
    except KeyboardInterrupt:
        return 130
    return _report(board, args.runs)


def cmd_runs(args: argparse.Namespace, farm: Farm) -> int:
    table = Table("run", "status", "target", "created", "takes", "error")
    for run in farm.runs(status=args.status, limit=args.limit, mine=args.mine):
        error = run.get("error") or {}
        table.add_row(run["id"], run["status"], run.get("target") or "",
                      (run.get("createdAt") or "")[:19].replace("T", " "), str(len(run["takes"])),
                      error.get("message", "") if isinstance(error, dict) else str(error))
    Console().print(table)
    return 0


def cmd_takes_get(args: argparse.Namespace, farm: Farm) -> int:
    out_dir = Path(args.output).expanduser()
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        takes = list(farm.run(args.id)["takes"])
    except FarmError as exc:
        if exc.status != 404:
            raise
        takes = [farm.take(args.id)]  # not a run of mine: a take, or neither (404 again)
    if not takes:
        console.print(f"run {args.id} has no takes (yet)")
        return 1
    for take in takes:
        print(farm.download(take, out_dir / take_name(take)), flush=True)
    return 0


def cmd_models_ls(args: argparse.Namespace, farm: Farm) -> int:
    held: dict[tuple[str, str], dict[str, Any]] = {}
    for worker in farm.workers():
        for entry in worker.get("models") or []:
            key = (str(entry.get("folder")), str(entry.get("name")))
            row = held.setdefault(key, {"size": entry.get("size"), "workers": [], "pools": set()})
            row["workers"].append(worker["name"])
            if worker.get("pool"):
                row["pools"].add(worker["pool"])
    table = Table("folder", "name", "size", "pools", "workers")
    for (folder, name), row in sorted(held.items()):
        table.add_row(folder, name, _size(row["size"]), ", ".join(sorted(row["pools"])),
                      ", ".join(sorted(row["workers"])))
    Console().print(table)
    return 0


def _size(size: Any) -> str:
    if not isinstance(size, int):
        return ""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size = size / 1024  # type: ignore[assignment]
    return f"{size:.1f} TiB"
