"""The Celery side of a worker group: n long-lived rank processes, one forward at a time.

The group is the *predict* function of a step batcher (workers/sampling/batcher.py):
`WorkerGroup.batcher(model, degrees)` is a StepBatcher whose every forward — the ready jobs of
every run slot of this worker, any mix of sizes, prompts, step positions and guidance — goes to
rank 0 over a local pipe (protocol.py) and comes back as one velocity per job. Jobs join and
leave at step boundaries, and their progress, cancellation, batch bounds and Euler updates stay
in this process exactly as on a single-GPU worker. So a group is one device shared by the
worker's slots, not one run at a time.

Lifecycle: the ranks start on the first forward (`world` subprocesses) and are reused while
their degrees fit; a forward that asks for other degrees restarts the group with them. A rank
that dies, or a forward that takes longer than `step_timeout` (a hung rank; the first forward
also covers loading the model), tears the whole group down and that forward raises
`GroupFault` — a ConnectionError: the step batcher fails every job of the forward with it (no
retry on a smaller batch), and the executor treats it as a worker fault: the attempt is handed
back and the run retried (exactly one take in the end). The next forward starts a fresh group.

Rendezvous: this process binds a `TCPStore` on port 0 for every incarnation, so the OS hands each
group its own port while it lives: two groups on one host never collide, and no port is
guessed, closed and re-bound.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from workers.parallel.config import Degrees
from workers.parallel.protocol import Forward, ModelRef, StepItem, receive, send
from workers.sampling.batcher import FORWARD_JOBS, StepBatcher

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 180.0  # spawn, import torch, join the group
STEP_TIMEOUT_S = 300.0  # the most one step may take (the first also loads the model)


class GroupFault(ConnectionError):
    """The worker group failed under a job (a rank died or hung); the run is retried elsewhere
    or later. A ConnectionError so `workers.faults.is_infrastructure_error` recognises it."""


class WorkerGroup:
    """`world` rank processes on `backend` ("gloo": CPU processes; "xfuser": one per GPU)."""

    def __init__(self, world: int, backend: str = "gloo", *,
                 step_timeout: float = STEP_TIMEOUT_S,
                 start_timeout: float = START_TIMEOUT_S) -> None:
        if world < 1:
            raise ValueError(f"a group needs at least one rank, got {world}")
        self.world, self.backend = world, backend
        self.step_timeout, self.start_timeout = step_timeout, start_timeout
        self.starts = 0  # incarnations so far
        self.degrees: Degrees | None = None
        self.last_report: dict[str, Any] = {}  # rank 0's account of the last forward's split
        self.forwards = 0  # forwards answered by this group (all incarnations)
        self._lock = threading.Lock()  # one forward at a time
        self._batchers: dict[tuple[ModelRef, Any], StepBatcher] = {}  # (model, key) → batcher
        self._procs: list[subprocess.Popen[bytes]] = []
        self._exits: list[int] = []  # a pidfd per rank: readable once it exits
        self._conn: Connection | None = None
        self._store: Any = None

    @property
    def port(self) -> int | None:
        """The rendezvous port of the live incarnation (None when not started)."""
        return None if self._store is None else int(self._store.port)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    @property
    def alive(self) -> bool:
        return bool(self._procs) and all(p.poll() is None for p in self._procs)

    # --- forwards ------------------------------------------------------------------------------

    def run(self, job: Any, model: ModelRef, degrees: Degrees) -> Any:
        """Denoise SampleJob `job` with `degrees`, sharing forwards with every other job run on
        this group for the same model and degrees at the same time; its latents [1, C, h, w].
        Its `on_progress` / `check_cancelled` run after every step (their exception stops the
        job there and propagates); GroupFault when the group fails under it."""
        return self.batcher(model, lambda _jobs: degrees, key=degrees).run(job)

    def batcher(self, model: ModelRef, degrees: Callable[[list[Any]], Degrees], *,
                key: Any = None, max_items: int = 16, max_tokens: int = 1 << 30,
                observe: Callable[[int], None] | None = None) -> StepBatcher:
        """The step batcher of `model` on this group (one per model and `key`); `degrees(jobs)`
        picks the split of each forward; `observe` as StepBatcher's (heartbeat stats)."""
        with self._lock:
            batcher = self._batchers.get((model, key))
            if batcher is None:
                batcher = self._batchers[(model, key)] = StepBatcher(
                    lambda jobs: self.forward(jobs, model, degrees(jobs)), max_items, max_tokens,
                    observe=observe)
            return batcher

    def forward(self, jobs: list[Any], model: ModelRef, degrees: Degrees) -> list[Any]:
        """One denoiser forward over SampleJobs `jobs` at their current steps, on the group;
        each job's guided velocity [1, C, H, W] on its own device. GroupFault when the group
        fails under it (the group is then down; the next forward starts a new one)."""
        if degrees.world != self.world:
            raise ValueError(f"degrees {degrees} need {degrees.world} ranks; this group has "
                             f"{self.world}")
        items = [StepItem(latents=job.latents.cpu(), timestep=job.timesteps[job.step].cpu(),
                          positive=job.positive.to("cpu"),
                          negative=None if job.negative is None else job.negative.to("cpu"),
                          guidance=job.guidance, extra=_portable(job.extra))
                 for job in jobs]
        with self._lock:
            self._ensure(degrees)
            assert self._conn is not None
            send(self._conn, "forward", Forward(model=model, degrees=degrees, items=items))
            steps = ", ".join(f"step {job.step + 1} of {job.total}" for job in jobs)
            message = self._receive(f"a forward of {len(jobs)} job(s) ({steps})")
            if message[0] != "velocities" or len(message[1]) != len(jobs):
                self.close(polite=False)
                raise GroupFault(f"worker group answered {message[0]!r} to a forward")
            self.last_report, self.forwards = message[2], self.forwards + 1
        for job, shared in zip(jobs, message[3], strict=True):
            if shared is not None:  # the family's predict ran this job's layout apart
                job.extra[FORWARD_JOBS] = shared
        return [v.to(job.latents.device) for v, job in zip(message[1], jobs, strict=True)]

    def _receive(self, what: str) -> tuple[Any, ...]:
        """rank 0's next message, or GroupFault (after a teardown) when a rank dies or hangs."""
        assert self._conn is not None
        deadline = time.monotonic() + self.step_timeout
        sentinels = list(self._exits)
        while True:
            left = deadline - time.monotonic()
            ready = wait([self._conn, *sentinels], timeout=max(0.0, left))
            if self._conn in ready:
                try:
                    return receive(self._conn)
                except (EOFError, OSError):
                    pass  # rank 0 is gone: its sentinel says how
            dead = [(i, p.returncode) for i, p in enumerate(self._procs) if p.poll() is not None]
            if dead:
                self.close(polite=False)
                ranks = ", ".join(f"rank {i} (exit {code})" for i, code in dead)
                raise GroupFault(f"worker group rank died during {what}: {ranks}; the group "
                                 "restarts")
            if left <= 0:
                self.close(polite=False)
                raise GroupFault(f"worker group hung: no answer for {self.step_timeout:.0f}s "
                                 f"during {what}; the group restarts")

    # --- lifecycle ---------------------------------------------------------------------------

    def _ensure(self, degrees: Degrees) -> None:
        if self.alive and self.degrees == degrees:
            return
        if self._procs:
            log.info("restarting the worker group (%s → %s)", self.degrees, degrees)
        self.close()
        self._start(degrees)

    def _start(self, degrees: Degrees) -> None:
        import torch.distributed as dist

        # Port 0: the OS picks a free port and this store holds it while the incarnation lives.
        self._store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                    timeout=timedelta(seconds=self.start_timeout))
        parent, child = socket.socketpair()
        self._conn = Connection(parent.detach())
        self.degrees, self.starts = degrees, self.starts + 1
        for rank in range(self.world):
            args = [sys.executable, "-m", "workers.parallel.rank", str(rank), str(self.world),
                    str(self.port), str(degrees.cfg), str(degrees.ulysses), str(degrees.ring),
                    self.backend]
            fds = (child.fileno(),) if rank == 0 else ()
            proc = subprocess.Popen([*args, *(str(fd) for fd in fds)], cwd=REPO, pass_fds=fds)
            self._procs.append(proc)
            self._exits.append(os.pidfd_open(proc.pid))
        child.close()
        log.info("worker group of %d (%s) starting on port %s", self.world, degrees, self.port)
        step, self.step_timeout = self.step_timeout, max(self.step_timeout, self.start_timeout)
        try:
            message = self._receive("the group's start")
        finally:
            self.step_timeout = step
        if message[0] != "ready":
            self.close(polite=False)
            raise GroupFault(f"worker group answered {message[0]!r} instead of ready")

    def close(self, polite: bool = True) -> None:
        """Stop every rank (asked to quit when `polite` and idle, else killed); free the port."""
        procs, exits, conn = self._procs, self._exits, self._conn
        self._procs, self._exits, self._conn, self.degrees = [], [], None, None
        if polite and conn is not None and procs and all(p.poll() is None for p in procs):
            with contextlib.suppress(OSError):
                send(conn, "quit")
            for proc in procs:
                _wait(proc, 5)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            _wait(proc, 10)
        for fd in exits:
            os.close(fd)
        if conn is not None:
            conn.close()
        self._store = None


def _portable(extra: dict[str, Any]) -> dict[str, Any]:
    """A job's own denoiser inputs as they travel to the ranks: tensors (and tuples of them) on
    CPU, plain values as they are; the step batcher's bookkeeping stays here."""
    def cpu(value: Any) -> Any:
        if isinstance(value, tuple):
            return tuple(cpu(v) for v in value)
        return value.cpu() if hasattr(value, "cpu") else value

    return {k: cpu(v) for k, v in extra.items() if k != FORWARD_JOBS and not callable(v)}


def _wait(proc: subprocess.Popen[bytes], seconds: float) -> None:
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=seconds)
