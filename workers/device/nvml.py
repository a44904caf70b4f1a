"""The host's NVIDIA GPUs as NVML (nvidia-ml-py) sees them: name, memory, NVLink. Torch-free.

Optional on purpose: without the package, the driver or a GPU, `host_gpus()` is empty and the
host runs a `cpu` worker. `./farm worker` reads it (before any worker starts, no torch) to start
one worker per GPU with its `gpu.<N>g` queue; each worker reports its card's live memory in its
heartbeats (`detect.ReportingPolicy`).

`INLINE_GPU_DESCRIPTION` simulates the host's GPUs instead, for tests and demos of a mixed
fleet on one machine: a JSON object, or a list of them, each
`{"name": "L40S", "vram_gb": 48, "bf16": true, "nvlink": 0}` (name and vram_gb required). A
simulated card is reported and routed to like a real one, but the worker computes on CPU.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

GB = 2**30
SIMULATED_KEYS = frozenset({"name", "vram_gb", "bf16", "nvlink"})


@dataclass(frozen=True)
class Gpu:
    """One card: its NVML `index`, memory in GiB, and active NVLink links (0: none)."""

    index: int
    name: str
    total_gb: float
    free_gb: float
    nvlink: int = 0
    bf16: bool = True
    simulated: bool = False

    def to_report(self) -> dict[str, Any]:
        """The JSON a heartbeat carries (Worker.device["gpu"]); /metrics reads it."""
        return {"index": self.index, "name": self.name, "totalGb": round(self.total_gb, 2),
                "freeGb": round(self.free_gb, 2),
                "usedGb": round(max(0.0, self.total_gb - self.free_gb), 2),
                "nvlink": self.nvlink, "simulated": self.simulated}


def host_gpus(env: Mapping[str, str] | None = None) -> list[Gpu]:
    """The simulated GPUs of INLINE_GPU_DESCRIPTION when set, else every GPU NVML sees."""
    source: Mapping[str, str] = os.environ if env is None else env
    raw = source.get("INLINE_GPU_DESCRIPTION", "").strip()
    return simulated_gpus(raw) if raw else nvml_gpus()


def simulated_gpus(raw: str) -> list[Gpu]:
    """Parse INLINE_GPU_DESCRIPTION (see the module docstring); ValueError names what is wrong."""
    try:
        value = json.loads(raw)
    except ValueError:
        raise ValueError(f"INLINE_GPU_DESCRIPTION must be JSON, got {raw!r}") from None
    items = value if isinstance(value, list) else [value]
    return [_simulated(i, item) for i, item in enumerate(items)]


def _simulated(index: int, item: Any) -> Gpu:
    if not isinstance(item, dict) or not {"name", "vram_gb"} <= item.keys():
        raise ValueError(f"INLINE_GPU_DESCRIPTION: each GPU is an object with name and vram_gb, "
                         f"got {item!r}")
    unknown = item.keys() - SIMULATED_KEYS
    if unknown:
        raise ValueError(f"INLINE_GPU_DESCRIPTION: unknown keys {sorted(unknown)}; "
                         f"expected {sorted(SIMULATED_KEYS)}")
    vram = item["vram_gb"]
    if isinstance(vram, bool) or not isinstance(vram, int | float) or vram <= 0:
        raise ValueError(f"INLINE_GPU_DESCRIPTION: vram_gb must be a number > 0, got {vram!r}")
    return Gpu(index=index, name=str(item["name"]), total_gb=float(vram), free_gb=float(vram),
               nvlink=int(item.get("nvlink", 0)), bf16=bool(item.get("bf16", True)),
               simulated=True)


def nvml_gpus() -> list[Gpu]:
    """Every GPU NVML sees, in NVML (PCI bus) order; [] without nvidia-ml-py, driver or GPU."""
    nvml = _nvml()
    if nvml is None:
        return []
    try:
        count = nvml.nvmlDeviceGetCount()
    except nvml.NVMLError:
        return []
    return [gpu for gpu in (nvml_gpu(i) for i in range(count)) if gpu is not None]


def nvml_gpu(index: int) -> Gpu | None:
    """GPU `index` as NVML sees it now (free memory is live); None if NVML cannot tell."""
    nvml = _nvml()
    if nvml is None:
        return None
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        name = nvml.nvmlDeviceGetName(handle)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    except nvml.NVMLError:
        return None
    major = _compute_major(nvml, handle)
    return Gpu(index=index, name=name.decode() if isinstance(name, bytes) else str(name),
               total_gb=memory.total / GB, free_gb=memory.free / GB,
               nvlink=_nvlink_links(nvml, handle), bf16=major is None or major >= 8)


def refreshed(gpu: Gpu) -> Gpu:
    """`gpu` with its free memory read again (a simulated card is returned as it is)."""
    if gpu.simulated:
        return gpu
    now = nvml_gpu(gpu.index)
    return replace(gpu, free_gb=now.free_gb) if now is not None else gpu


def pinned_index(env: Mapping[str, str] | None = None) -> int:
    """The NVML index of the GPU this process computes on: CUDA_VISIBLE_DEVICES' first entry
    (an index, as `./farm worker` sets it with CUDA_DEVICE_ORDER=PCI_BUS_ID, or a GPU UUID),
    else 0."""
    source: Mapping[str, str] = os.environ if env is None else env
    first = source.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if first.isdigit():
        return int(first)
    nvml = _nvml()
    if first.startswith(("GPU-", "MIG-")) and nvml is not None:
        try:
            return int(nvml.nvmlDeviceGetIndex(nvml.nvmlDeviceGetHandleByUUID(first)))
        except nvml.NVMLError:
            return 0
    return 0


def _nvlink_links(nvml: Any, handle: Any) -> int:
    """Active NVLink links of a card; 0 on cards without NVLink (NVML answers NotSupported)."""
    links = 0
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        try:
            links += int(nvml.nvmlDeviceGetNvLinkState(handle, link) == nvml.NVML_FEATURE_ENABLED)
        except nvml.NVMLError:
            break
    return links


def _compute_major(nvml: Any, handle: Any) -> int | None:
    try:
        return int(nvml.nvmlDeviceGetCudaComputeCapability(handle)[0])
    except nvml.NVMLError:
        return None


@cache
def _nvml() -> Any:
    """The initialised pynvml module, or None without the package or a usable driver."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    return pynvml
