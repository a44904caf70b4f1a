"""The step batcher: one denoiser forward per iteration over every ready job.

Threads that want an image call `batcher.run(job)` (the worker's run slots, each its own run).
Each iteration takes the ready jobs that fit the bounds — at most `max_items` forward items (a
CFG job is two), `max_tokens` latent tokens and `max_loras` distinct LoRA files (each job's
LoRAs are applied to its own rows: workers/models/lora.py); a job that does not fit waits at the head of the
line for the next iteration — runs ONE `predict(jobs)` call over them (for Z-Image one
transformer forward over per-item lists: different prompts, sizes, step positions and guidance,
each job with its own sigmas), then applies each job's own scheduler update (`job.advance`:
flow-matching Euler unless the job brings its own; the batcher batches the forward only). A job
becomes ready
again only after its owner thread has reported progress and checked cancellation, so jobs join
and leave at step boundaries and a cancelled job never runs more than the step already in flight.

Admission: whichever waiting thread finds nobody driving drives the next iteration (there is no
background thread). Before it takes the batch it waits for the jobs stepped by the previous
iteration to come back (their owners are reporting progress), at most `gather_seconds`; a new
job never waits for anyone. A lone job therefore never waits at all: it is stepped exactly as
the diffusers pipeline steps it, bit for bit. Batched jobs differ from their solo runs only by
float rounding (the kernels' reduction order changes with the batch's shapes).

Every forward and its Euler updates run on the process's device thread (`on_device_thread`,
workers/device/thread.py), whichever slot drives: torch's CPU kernels keep a thread team per
calling thread, and a second team makes every parallel region of the process run single-threaded.

Isolation: a forward that raises is retried on each half of its batch (an out-of-memory first
lowers the item bound for the following iterations), down to single jobs; only a job that fails
alone gets the error, so one bad or oversized job never fails the others. A ConnectionError (the
device is gone: a worker group's rank died) fails the whole batch at once, without retries.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from workers.device.thread import on_device_thread
from workers.sampling.job import SampleJob

log = logging.getLogger(__name__)

Tensor = Any  # torch.Tensor
# predict(jobs) -> one velocity per job, each [1, C, H, W] float32 (already guided).
Predict = Callable[[list[SampleJob]], list[Tensor]]
FORWARD_JOBS = "forward_jobs"  # job.extra key: the jobs of the forward that served this job
GATHER_SECONDS = 0.02  # the most an iteration waits for the last batch's jobs to come back
OOM_RECOVERY_FORWARDS = 50  # forwards after an out-of-memory before the item bound is lifted


def max_loras_per_forward() -> int:
    """INLINE_MAX_LORAS_PER_FORWARD (default 16): the most distinct LoRA files one forward
    applies (each is one more pair of small matmuls per targeted layer); beyond it a job waits
    for the next forward."""
    raw = os.environ.get("INLINE_MAX_LORAS_PER_FORWARD", "").strip() or "16"
    try:
        return max(1, int(raw))
    except ValueError:
        raise ValueError(f"INLINE_MAX_LORAS_PER_FORWARD must be an integer, got {raw!r}") from None


def is_out_of_memory(exc: BaseException) -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover — workers always have torch
        return False
    return isinstance(exc, torch.OutOfMemoryError)


def release_cached_memory() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class StepBatcher:
    """Owns one denoiser; steps the jobs of every thread that calls `run`.

    `observe(jobs)` is called after every successful forward with how many jobs shared it
    (the worker's heartbeat stats); `forwards` and `sizes` count the same here.
    """

    def __init__(
        self,
        predict: Predict,
        max_items: int = 16,
        max_tokens: int = 1 << 30,
        *,
        max_batch: int | None = None,  # older name of max_items
        gather_seconds: float = GATHER_SECONDS,
        observe: Callable[[int], None] | None = None,
        max_loras: int | None = None,
    ) -> None:
        max_items = max_batch if max_batch is not None else max_items
        if max_items < 1 or max_tokens < 1:
            raise ValueError(f"batch bounds must be >= 1, got {max_items} items, {max_tokens} tokens")
        self._predict = predict
        self.max_items, self.max_tokens = max_items, max_tokens
        self.gather_seconds = gather_seconds
        self.max_loras = max_loras if max_loras is not None else max_loras_per_forward()
        self._observe = observe
        self._lock = threading.Lock()  # guards everything below
        self._gather = threading.Condition(self._lock)  # the driver waits here for the batch
        self._wake: dict[SampleJob, threading.Condition] = {}  # each job's owner waits on its own
        self._active: set[SampleJob] = set()  # jobs inside run()
        self._ready: list[SampleJob] = []  # jobs waiting for their next step, oldest first
        self._driving = False
        self._oom_items: int | None = None  # a lowered item bound after an out-of-memory
        self._since_oom = 0
        self.forwards = 0  # successful forwards so far
        self.sizes: Counter[int] = Counter()  # successful forwards by how many jobs shared them

    # --- a job's thread ----------------------------------------------------------------------

    def run(self, job: SampleJob) -> Tensor:
        """Denoise `job` to the end and return its latents [1, C, H, W] float32.

        Calls `job.on_progress(done, total)` after every step (`job.progress`: a sampler's
        extra evaluations within a step report nothing) and `job.check_cancelled()` after every
        evaluation;
        an exception from either (RunCancelled) or the job's own forward error propagates here.
        """
        job.check_cancelled()
        with self._lock:
            self._active.add(job)
            self._wake[job] = threading.Condition(self._lock)
        try:
            reported = 0
            while not job.done:
                self._await_step(job)
                if job.error is not None:
                    raise job.error
                done, total = job.progress
                if done != reported or job.done:  # a step's extra evaluations report nothing
                    job.on_progress(done, total)
                    reported = done
                job.check_cancelled()
            return job.latents
        finally:
            with self._lock:
                self._active.discard(job)
                self._wake.pop(job, None)
                if job in self._ready:
                    self._ready.remove(job)
                self._batch_may_be_complete()

    def _await_step(self, job: SampleJob) -> None:
        """Make `job` ready and return once an iteration stepped it (or failed it). Waits on
        the job's own condition, so an iteration wakes only the threads it concerns."""
        before = job.step

        def stepped() -> bool:
            return job.step != before or job.error is not None

        with self._lock:
            self._ready.append(job)
            self._batch_may_be_complete()
        while True:
            with self._lock:
                while self._driving and not stepped():
                    self._wake[job].wait()
                if stepped():
                    return
                self._driving = True
            try:
                self._iterate()
            finally:
                with self._lock:
                    self._driving = False
                    self._wake_after_iteration()

    def _batch_may_be_complete(self) -> None:
        """Wake the driver once every active job is ready. Call holding the lock."""
        if self._driving and len(self._ready) >= len(self._active):
            self._gather.notify()

    def _wake_after_iteration(self) -> None:
        """Wake the owners of the jobs just stepped, and one waiting job to drive the next
        iteration (the oldest left out). Call holding the lock."""
        waiting = set(self._ready)
        for job, wake in self._wake.items():
            if job not in waiting:
                wake.notify()
        if self._ready:
            self._wake[self._ready[0]].notify()

    # --- the driving thread ------------------------------------------------------------------

    def _iterate(self) -> None:
        """One batch: gather, take what fits, forward (split on failure), step each job."""
        with self._lock:
            self._gather.wait_for(lambda: len(self._ready) >= len(self._active),
                                  timeout=self.gather_seconds)
            batch = self._take()
        if batch:
            self._forward(batch)

    def _take(self) -> list[SampleJob]:
        """The ready jobs that fit the bounds, oldest first; the first one always fits (a job
        over the budget on its own runs alone). Call holding the lock."""
        max_items = min(self.max_items, self._oom_items or self.max_items)
        batch: list[SampleJob] = []
        items = tokens = 0
        loras: set[int] = set()  # the distinct LoRA files (weights) of the batch
        for job in self._ready:
            more = loras | {id(lora.weights) for lora in job.loras}
            if batch and (items + job.items > max_items or tokens + job.tokens > self.max_tokens
                          or len(more) > self.max_loras):
                continue  # waits at the head of the line: first in the next iteration
            batch.append(job)
            items, tokens, loras = items + job.items, tokens + job.tokens, more
        for job in batch:
            self._ready.remove(job)
        return batch

    def _forward(self, batch: list[SampleJob]) -> None:
        try:
            on_device_thread(self._step, batch)
        # Not swallowed: a job that fails alone gets it, and its owner re-raises it from run().
        except Exception as exc:  # noqa: BLE001
            self._split_after(batch, exc)
            return
        self._count(len(batch))

    def _step(self, batch: list[SampleJob]) -> None:
        """One forward over `batch` and each job's own update (`job.advance`, else Euler; on the
        device thread). Every
        update is computed before any job changes, so a failure leaves the batch as it was for
        the retry."""
        velocities = self._predict(batch)
        stepped = [(job.advance or euler_latents)(job, v)
                   for job, v in zip(batch, velocities, strict=True)]
        for job, velocity, latents in zip(batch, velocities, stepped, strict=True):
            # a family's predict that splits the batch into several forwards (sizes that do not
            # mix) says how many jobs shared this job's: its progress `batch` tells the truth
            shared = int(job.extra.pop(FORWARD_JOBS, len(batch)))
            job.latents, job.velocity, job.step, job.batch = latents, velocity, job.step + 1, shared

    def _split_after(self, batch: list[SampleJob], exc: Exception) -> None:
        """A failed forward: retry each half (an OOM also lowers the item bound); a job that
        fails alone gets the error. A ConnectionError is the device itself failing (a worker
        group's rank died: workers/parallel/group.py), not a job: every job of the batch gets
        it at once, and the executor hands their runs back to be retried."""
        if isinstance(exc, ConnectionError):
            for job in batch:
                job.error = exc
            return
        if is_out_of_memory(exc):
            release_cached_memory()
            items = sum(job.items for job in batch)
            self._oom_items, self._since_oom = max(1, items // 2), 0
            log.warning("out of memory at %d jobs (%d items); retrying smaller", len(batch), items)
        if len(batch) == 1:
            batch[0].error = exc
            return
        half = len(batch) // 2
        self._forward(batch[:half])
        self._forward(batch[half:])

    def _count(self, jobs: int) -> None:
        self.forwards += 1
        self.sizes[jobs] += 1
        if self._oom_items is not None:
            self._since_oom += 1
            if self._since_oom >= OOM_RECOVERY_FORWARDS:
                self._oom_items = None
        if self._observe is not None:
            self._observe(jobs)


def euler_latents(job: SampleJob, velocity: Tensor) -> Tensor:
    """The job's next latents x + (σ_{i+1} − σ_i)·v, in float32, exactly as
    FlowMatchEulerDiscreteScheduler.step."""
    i = job.step
    dt = job.sigmas[i + 1] - job.sigmas[i]  # 0-d float32
    return (job.latents.float() + dt * velocity).to(velocity.dtype)
