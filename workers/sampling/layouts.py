"""Splitting a step batcher's batch into the forwards a family's denoiser can take.

Jobs that cannot share a forward run apart in the same step: each job's progress `batch` is the
size of the forward that served it, and the worker's heartbeat counts why, per `Layout` field
that differed (`apart_latent_size`, `apart_references`, `apart_prompt_tokens`,
`apart_image_slots`, `apart_timestep_zero`: steps whose jobs ran in more than one forward for
that reason).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, NamedTuple

from workers.counters import count
from workers.sampling.batcher import FORWARD_JOBS
from workers.sampling.job import SampleJob


class Layout(NamedTuple):
    """What jobs must share to share a family's forward; a family fills the fields its
    transformer reads once per batch and leaves the others empty."""

    latent_size: tuple[int, ...]  # the latent's shape (one rotary table / set of positions)
    references: tuple[tuple[int, ...], ...] = ()  # each reference latent's shape
    prompt_tokens: tuple[int, ...] = ()  # each prompt row's token count (unpadded families)
    image_slots: tuple[Any, ...] = ()  # where each prompt row's image tokens sit
    timestep_zero: bool = False  # references read at timestep 0 (Qwen-Image-Edit-2511's)


def apart_reasons(layouts: list[Hashable]) -> list[str]:
    """The `Layout` fields that differ between `layouts` (why their jobs ran apart);
    ["layout"] for layouts of another kind."""
    named = [layout for layout in layouts if isinstance(layout, Layout)]
    if len(named) < len(layouts):
        return ["layout"]
    return [field for index, field in enumerate(Layout._fields)
            if len({layout[index] for layout in named}) > 1]


def forward_by_layout(jobs: list[SampleJob], layout: Callable[[SampleJob], Hashable],
                      forward: Callable[[list[SampleJob]], list[Any]]) -> list[Any]:
    """Each job's output, from one `forward(group)` per distinct `layout(job)` (what must match
    for jobs to share a forward: a latent size, reference sizes), in the jobs' order; each job's
    `FORWARD_JOBS` is its group's size (its progress event's `batch`: jobs of other layouts ran
    apart, counted by reason: `apart_reasons`)."""
    out: dict[int, Any] = {}
    groups: dict[Hashable, list[int]] = {}
    for index, job in enumerate(jobs):
        groups.setdefault(layout(job), []).append(index)
    if len(groups) > 1:
        for reason in apart_reasons(list(groups)):
            count(f"apart_{reason}")
    for members in groups.values():
        group = [jobs[i] for i in members]
        for i, result in zip(members, forward(group), strict=True):
            out[i] = result
            jobs[i].extra[FORWARD_JOBS] = len(group)
    return [out[i] for i in range(len(jobs))]
