"""How a worker group splits one image: parsing INLINE_PARALLEL, and the method from the hardware.

Torch-free and xfuser-free (the worker checks it at start, before anything heavy loads).

    INLINE_PARALLEL=            unset / `off`: not a group worker (unless it serves xfuser.<n>,
                                which means `auto` with n ranks)
    INLINE_PARALLEL=auto        the method from the links and each job's guidance (below)
    INLINE_PARALLEL=ulysses=2,ring=2   fixed degrees; `cfg=2,ulysses=2` likewise

Degrees (what xfuser 0.7 offers for Z-Image, see FACTS.md): `ulysses` and `ring` split the image
tokens (sequence parallelism, USP; world = cfg × ulysses × ring), `cfg` computes the positive and
the negative half of a guided step on different ranks (2 at most; it only helps when guidance > 0).
PipeFusion and tensor parallelism do not exist for Z-Image and are refused by name.

Auto: CFG-parallel takes a factor 2 when the job has guidance > 0; the rest of the ranks split
the sequence with Ulysses over NVLink (an all-to-all per layer wants the bandwidth) and Ring over
PCIe (it overlaps its peer-to-peer passes with the attention compute).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

METHODS = ("cfg", "ulysses", "ring")
UNSUPPORTED = {
    "pipefusion": "PipeFusion does not exist for Z-Image in xfuser 0.7",
    "tensor": "xfuser 0.7 has no tensor parallelism for Z-Image",
    "tp": "xfuser 0.7 has no tensor parallelism for Z-Image",
    "data": "data parallelism is the farm's job (one run per worker), not the group's",
}
QUEUE = re.compile(r"^xfuser\.(\d+)$")


class ParallelConfigError(ValueError):
    """INLINE_PARALLEL, the queues or the GPUs disagree; the worker refuses to start."""


@dataclass(frozen=True)
class Degrees:
    """One split of a denoise over `world` ranks: rank = cfg_rank · sp + sp_rank."""

    cfg: int = 1
    ulysses: int = 1
    ring: int = 1

    @property
    def sp(self) -> int:
        """Ranks that share one item's tokens (sequence parallel degree)."""
        return self.ulysses * self.ring

    @property
    def world(self) -> int:
        return self.cfg * self.sp

    def __str__(self) -> str:
        parts = [f"{m}={getattr(self, m)}" for m in METHODS if getattr(self, m) > 1]
        return ",".join(parts) or "single"


@dataclass(frozen=True)
class GroupSetup:
    """What a group worker runs: `world` ranks, fixed `degrees` or None for auto, its links."""

    world: int
    degrees: Degrees | None  # None: auto, decided per job from `nvlink` and the job's guidance
    nvlink: bool = False

    def degrees_for(self, guidance: float) -> Degrees:
        return self.degrees or auto_degrees(self.world, nvlink=self.nvlink, guidance=guidance)


def parse_parallel(value: str | None) -> Degrees | str | None:
    """INLINE_PARALLEL → fixed Degrees, "auto", or None (off). ParallelConfigError names the fault."""
    text = (value or "").strip().lower()
    if text in ("", "off", "0", "none"):
        return None
    if text == "auto":
        return "auto"
    degrees: dict[str, int] = {}
    for part in text.split(","):
        name, sep, number = part.strip().partition("=")
        name = name.strip()
        if name in UNSUPPORTED:
            raise ParallelConfigError(f"INLINE_PARALLEL={value!r}: {UNSUPPORTED[name]}; use "
                                      "ulysses=, ring= and cfg=")
        if name not in METHODS or not sep or not number.strip().isdigit():
            raise ParallelConfigError(
                f"INLINE_PARALLEL={value!r}: expected `auto`, `off` or degrees such as "
                f"`ulysses=2,ring=2` or `cfg=2,ulysses=2` (methods: {', '.join(METHODS)})")
        if name in degrees:
            raise ParallelConfigError(f"INLINE_PARALLEL={value!r}: {name} is given twice")
        degrees[name] = int(number)
        if degrees[name] < 1:
            raise ParallelConfigError(f"INLINE_PARALLEL={value!r}: {name} must be >= 1")
    if degrees.get("cfg", 1) > 2:
        raise ParallelConfigError(f"INLINE_PARALLEL={value!r}: cfg splits a guided step in its "
                                  "two halves, so cfg is 1 or 2")
    return Degrees(**degrees)


def auto_degrees(world: int, *, nvlink: bool, guidance: float) -> Degrees:
    """The split of `world` ranks for one job: cfg=2 only when guidance > 0 (and world is even),
    the rest Ulysses over NVLink, Ring over PCIe."""
    cfg = 2 if guidance > 0 and world % 2 == 0 else 1
    sp = world // cfg
    return Degrees(cfg=cfg, ulysses=sp, ring=1) if nvlink else Degrees(cfg=cfg, ulysses=1, ring=sp)


def queue_world(queues: Iterable[str]) -> int | None:
    """n of the worker's `xfuser.<n>` queue; None without one. Two different n are an error."""
    worlds = {int(m.group(1)) for q in queues if (m := QUEUE.match(q.strip()))}
    if len(worlds) > 1:
        raise ParallelConfigError(f"a worker group has one size; it serves "
                                  f"{', '.join(f'xfuser.{n}' for n in sorted(worlds))}")
    return worlds.pop() if worlds else None


def group_setup(value: str | None, queues: Iterable[str], gpus: int,
                nvlink: bool = False) -> GroupSetup | None:
    """The group a worker runs, checked at its start; None for an ordinary worker.

    `gpus`: the GPUs this worker owns (0 on CPU, where the ranks are gloo processes). Raises
    ParallelConfigError when the degrees do not multiply to the GPU count or to the n of the
    `xfuser.<n>` queue it serves, or when a group serves no xfuser queue.
    """
    setting, served = parse_parallel(value), queue_world(queues)
    if setting is None and served is None:
        return None
    world = setting.world if isinstance(setting, Degrees) else (served or gpus)
    where = f"INLINE_PARALLEL={value!r}" if setting is not None else f"queue xfuser.{served}"
    if world < 2:
        raise ParallelConfigError(f"{where}: a group needs at least 2 ranks, got {world}")
    if gpus and world != gpus:
        raise ParallelConfigError(f"{where}: the degrees multiply to {world} ranks but this "
                                  f"worker has {gpus} GPUs; they must be equal")
    if served is None:
        raise ParallelConfigError(f"{where} makes this worker a group of {world}: serve "
                                  f"xfuser.{world} (-Q …,xfuser.{world})")
    if served != world:
        raise ParallelConfigError(f"{where} is a group of {world} ranks but the worker serves "
                                  f"xfuser.{served}; they must be equal")
    return GroupSetup(world, setting if isinstance(setting, Degrees) else None, nvlink)
