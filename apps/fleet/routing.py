"""Where a run can go: its memory estimate and the cheapest live queue that fits (torch-free).

The estimate is deliberately simple and explained in every refusal: the weights are the model
files' sizes (stored in the dtype the device policy computes in — bf16 files on bf16 GPUs), plus
activations that grow with the image (a diffusion transformer's attention over the latent
tokens, the VAE decode at full size): ACTIVATION_BASE_GB + ACTIVATION_GB_PER_MPX per megapixel.
A `gpu-max` worker must hold everything at once; a `lowvram` worker offloads, so it needs the
largest single model plus the activations. CPU workers run anything (slowly) in host memory.

Multi-GPU groups (`xfuser.<n>`, workers/parallel/): a run whose graph asks for a split
(`parallel: "n"` on a sampler) goes to `xfuser.<n>` whether or not a worker serves it yet (it then
waits, and its wait reason says no live worker serves xfuser.<n>); with `parallel: "auto"` it goes
to a group only when no single live GPU holding its files can hold it but a group can — every
rank holds all the weights, the split divides only the activations; `off` never splits. A family
that cannot split (FamilyInfo.splits: SDXL, Qwen-Image 2.1, LTX-2) never goes to a group: asking
for one is a 422 that says so.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from apps.fleet.capability import GPU_CLASSES_GB

ACTIVATION_BASE_GB = 1.0
ACTIVATION_GB_PER_MPX = 3.0


class RunCannotFit(Exception):
    """No live worker that holds the run's files could ever fit it (a 422 at submit)."""


@dataclass(frozen=True)
class Need:
    """A run's memory estimate in GB."""

    weights_gb: float
    largest_gb: float
    activations_gb: float

    @property
    def total_gb(self) -> float:
        return self.weights_gb + self.activations_gb

    @property
    def offloaded_gb(self) -> float:
        return self.largest_gb + self.activations_gb

    def to_wire(self) -> dict[str, float]:
        return {"weightsGb": round(self.weights_gb, 2), "largestGb": round(self.largest_gb, 2),
                "activationsGb": round(self.activations_gb, 2), "vramGb": round(self.total_gb, 2)}


def need_estimate(*, model_sizes: list[int], pixels: int,
                  activation: tuple[float, float] = (ACTIVATION_BASE_GB, ACTIVATION_GB_PER_MPX),
                  ) -> Need:
    """The memory a run with these model files (bytes) at `pixels` output pixels needs;
    `activation` is its families' (base GB, GB per megapixel), apps/graphs/families.py."""
    weights = sum(model_sizes) / 1e9
    largest = max(model_sizes, default=0) / 1e9
    base, per_mpx = activation
    activations = base + per_mpx * pixels / 1e6 if model_sizes else 0
    return Need(weights, largest, activations)


def parallel_request(values: Iterable[Any]) -> str:
    """The split a run asks for, from its closure's `parallel` params (unset: auto): the largest
    group size any sampler asks for, else "off" when one says off, else "auto". Put it in the
    requirement as `parallel`."""
    asked = [str(v) for v in values if v not in (None, "")]
    sizes = [int(v) for v in asked if v.isdigit()]
    if sizes:
        return str(max(sizes))
    return "off" if "off" in asked else "auto"


def group_fits(device: dict[str, Any], need: dict[str, Any], ranks: int) -> bool:
    """Whether a group of `ranks` GPUs like `device` holds a run of `need`: each rank holds every
    weight and 1/ranks of the activations (sequence parallel)."""
    if device.get("profile", "cpu") == "cpu" or not need:
        return True
    vram = float(device.get("vram_gb") or 0)
    weights, activations = float(need.get("weightsGb", 0)), float(need.get("activationsGb", 0))
    return weights + activations / ranks <= vram


def worker_fits(device: dict[str, Any], need: dict[str, Any]) -> bool:
    """Whether a worker with `device` (its heartbeat's description) can hold a run of `need`."""
    profile = device.get("profile", "cpu")
    if profile == "cpu" or not need:
        return True
    vram = float(device.get("vram_gb") or 0)
    if profile == "lowvram" or device.get("cpu_offload"):
        return float(need.get("largestGb", 0)) + float(need.get("activationsGb", 0)) <= vram
    return float(need.get("vramGb", 0)) <= vram


def route(requirement: dict[str, Any], workers: list[Any]) -> str:
    """The queue for `requirement` among live `workers` (name, queues, device, model_files,
    state): the smallest GPU class that fits and holds the files (non-draining first), else
    `cpu` when a CPU worker holds them, else `gpu` (wait for a capable worker). Raises
    RunCannotFit when workers hold the files but none could ever fit the run (nor a group, with
    `parallel` auto). A requested split (`parallel` "n") goes to `xfuser.<n>`."""
    parallel = str(requirement.get("parallel") or "auto")
    unsplit = _unsplit_families(requirement)
    if parallel.isdigit():
        if unsplit:
            raise RunCannotFit(f"the run asks for parallel \"{parallel}\" but its "
                               f"{' and '.join(unsplit)} model cannot be split across GPUs: set "
                               "parallel \"off\" (or \"auto\")")
        return f"xfuser.{parallel}"
    if not requirement.get("models"):
        return "cpu"
    needed = {(m["folder"], m["name"]) for m in requirement["models"]}
    need = requirement.get("need") or {}
    holders = [w for w in workers
               if needed <= {(m["folder"], m["name"]) for m in w.model_files}]
    fitting = [w for w in holders if worker_fits(w.device, need)]
    if holders and not fitting:
        group = _group_queue(need, holders) if parallel == "auto" and not unsplit else None
        if group is None:
            raise RunCannotFit(_why_not(need, holders))
        return group
    for pool in ([w for w in fitting if w.state != "draining"], fitting):
        gpu = sorted({q for w in pool for q in w.queues if q.startswith("gpu.")}, key=_vram_of)
        if gpu:
            return gpu[0]
        if any("cpu" in w.queues for w in pool):
            return "cpu"
    return "gpu"


_GROUP = re.compile(r"^xfuser\.(\d+)$")


def _unsplit_families(requirement: dict[str, Any]) -> list[str]:
    """The run's model families whose denoise cannot split across a GPU group (`splits`)."""
    from workers.models.families import REGISTERED, info

    return [f for f in requirement.get("families") or () if f in REGISTERED and not info(f).splits]


def _group_queue(need: dict[str, Any], holders: list[Any]) -> str | None:
    """The smallest `xfuser.<n>` queue whose serving worker holds the files and could fit."""
    sizes = sorted({int(m.group(1)) for w in holders for q in w.queues
                    if (m := _GROUP.match(q)) and group_fits(w.device, need, int(m.group(1)))})
    return f"xfuser.{sizes[0]}" if sizes else None


def _why_not(need: dict[str, Any], holders: list[Any]) -> str:
    biggest = max(float(w.device.get("vram_gb") or 0) for w in holders)
    total, offloaded = float(need.get("vramGb", 0)), float(need.get("largestGb", 0)) + float(
        need.get("activationsGb", 0))
    fits = next((gb for gb in GPU_CLASSES_GB if gb >= total), None)
    would = f"a gpu-max worker with {math.ceil(total)} GB (gpu.{fits}g)" if fits else (
        f"no single GPU class ({GPU_CLASSES_GB[-1]} GB at most)")
    return (f"this run needs about {total:.1f} GB of GPU memory ({need.get('weightsGb', 0):.1f} GB "
            f"of weights + {need.get('activationsGb', 0):.1f} GB for its resolution); the live "
            f"workers holding its model files have at most {biggest:.0f} GB. It would fit "
            f"{would}, or a lowvram worker with {math.ceil(offloaded)} GB; or lower the "
            "resolution")


def _vram_of(queue: str) -> float:
    try:
        return float(queue.removeprefix("gpu.").rstrip("g"))
    except ValueError:
        return float("inf")
