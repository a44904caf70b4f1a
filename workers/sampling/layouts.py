"""Splitting a step batcher's batch into the forwards a family's denoiser can take."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from workers.sampling.batcher import FORWARD_JOBS
from workers.sampling.job import SampleJob


def forward_by_layout(jobs: list[SampleJob], layout: Callable[[SampleJob], Hashable],
                      forward: Callable[[list[SampleJob]], list[Any]]) -> list[Any]:
    """Each job's output, from one `forward(group)` per distinct `layout(job)` (what must match
    for jobs to share a forward: a latent size, reference sizes), in the jobs' order; each job's
    `FORWARD_JOBS` is its group's size (its progress event's `batch`: jobs of other layouts ran
    apart)."""
    out: dict[int, Any] = {}
    groups: dict[Hashable, list[int]] = {}
    for index, job in enumerate(jobs):
        groups.setdefault(layout(job), []).append(index)
    for members in groups.values():
        group = [jobs[i] for i in members]
        for i, result in zip(members, forward(group), strict=True):
            out[i] = result
            jobs[i].extra[FORWARD_JOBS] = len(group)
    return [out[i] for i in range(len(jobs))]
