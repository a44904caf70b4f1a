"""Capability queue names (torch-free; shared by the router and the workers).

`cpu` — any worker; `gpu.<N>g` — a GPU worker with at least N GB of usable VRAM, N the largest
standard class it reaches; `xfuser.<world size>` — a multi-GPU group (a later issue).
"""

from __future__ import annotations

GPU_CLASSES_GB = (8, 12, 16, 24, 32, 40, 48, 80, 96, 141)


def gpu_queue_for_vram(vram_gb: float) -> str | None:
    """The `gpu.<N>g` queue of a GPU with `vram_gb` usable; None below the smallest class."""
    # Cards report a little under their marketed size (an H200 shows ~140 of 141 GB, an 8 GB card ~7.6).
    fitting = [gb for gb in GPU_CLASSES_GB if gb <= vram_gb * 1.06]
    return f"gpu.{fitting[-1]}g" if fitting else None
