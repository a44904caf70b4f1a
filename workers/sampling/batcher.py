"""The step batcher: one denoiser forward per iteration over every ready job.

Threads that want an image call `batcher.run(job)`. Each iteration takes the ready jobs (up to
`max_batch`, first come first served), runs ONE `predict(jobs)` call over them (for Z-Image one
transformer forward over per-item lists: different prompts, sizes and step positions), then
applies each job's own Euler update. A job becomes ready again only after its owner thread has
reported progress and checked cancellation, so jobs join and leave at step boundaries and a
cancelled job never runs more than the step already in flight.

Whichever waiting thread gets the forward lock drives the next iteration; there is no
background thread. A lone job is stepped exactly as the diffusers pipeline steps it (bit for
bit); batched jobs differ from their solo runs only by float rounding.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from workers.sampling.job import SampleJob

Tensor = Any  # torch.Tensor
# predict(jobs) -> one velocity per job, each [1, C, H, W] float32 (already guided).
Predict = Callable[[list[SampleJob]], list[Tensor]]


class StepBatcher:
    """Owns one denoiser; steps the jobs of every thread that calls `run`."""

    def __init__(self, predict: Predict, max_batch: int = 4) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self._predict = predict
        self.max_batch = max_batch
        self._forward = threading.Lock()  # one forward at a time on the device
        self._mutex = threading.Lock()  # guards _ready
        self._ready: list[SampleJob] = []
        self.forwards = 0  # iterations run so far (for tests and worker reports)

    def run(self, job: SampleJob) -> Tensor:
        """Denoise `job` to the end and return its latents [1, C, H, W] float32.

        Calls `job.on_progress(done, total)` then `job.check_cancelled()` after every step;
        an exception from either (RunCancelled) or from the forward propagates here.
        """
        job.check_cancelled()
        while not job.done:
            before = job.step
            with self._mutex:
                self._ready.append(job)
            with self._forward:
                if job.step == before and job.error is None:  # nobody stepped it meanwhile
                    self._iterate()
            if job.error is not None:
                raise job.error
            job.on_progress(job.step, job.total)
            job.check_cancelled()
        return job.latents

    def _iterate(self) -> None:
        """One forward over the first `max_batch` ready jobs, then each job's Euler update."""
        with self._mutex:
            batch, self._ready = self._ready[: self.max_batch], self._ready[self.max_batch :]
        self.forwards += 1
        try:
            velocities = self._predict(batch)
            for job, v in zip(batch, velocities, strict=True):
                euler_step(job, v)
        # Not swallowed: each owner thread re-raises it from run(). noqa: the catch is the hand-off.
        except Exception as exc:  # noqa: BLE001
            for job in batch:
                job.error = exc


def euler_step(job: SampleJob, velocity: Tensor) -> None:
    """x ← x + (σ_{i+1} − σ_i)·v, in float32, exactly as FlowMatchEulerDiscreteScheduler.step."""
    i = job.step
    dt = job.sigmas[i + 1] - job.sigmas[i]  # 0-d float32
    job.latents = (job.latents.float() + dt * velocity).to(velocity.dtype)
    job.velocity = velocity
    job.step = i + 1
