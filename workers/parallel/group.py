"""The Celery side of a worker group: n long-lived rank processes, one job at a time.

`WorkerGroup.run(job, model_ref)` hands one SampleJob's denoise to rank 0 over a local pipe and
drives it step by step: each step's latents come back, the job's own `on_progress` and
`check_cancelled` run here (as under the step batcher), and the answer (go / stop) goes back.

Lifecycle: the ranks start on the first job (`world` subprocesses) and are reused
while their degrees fit the jobs; a job that needs other degrees (auto mode: a guided job after
an unguided one) restarts the group with them. A rank that dies, or a step that takes longer
than `step_timeout` (a hung rank; the first step also covers loading the model), tears the
whole group down and the job raises `GroupFault` — a ConnectionError, so the executor treats it
as a worker fault: the attempt is handed back and the run retried (exactly one take in the
end). The next job starts a fresh group.

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
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from workers.parallel.config import Degrees
from workers.parallel.protocol import DenoiseJob, ModelRef, receive, send

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
        self.last_report: dict[str, Any] = {}  # rank 0's account of the last job's split
        self._lock = threading.Lock()  # one job at a time: the group is one run slot
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

    # --- a job -------------------------------------------------------------------------------

    def run(self, job: Any, model: ModelRef, degrees: Degrees) -> Any:
        """Denoise SampleJob `job` on the group with `degrees`; return its latents [1, C, h, w]
        on the job's device. Updates `job.latents`, `job.velocity`, `job.step` after every step
        and calls its `on_progress` / `check_cancelled` (whose exception stops the group's job
        at this step and propagates). Raises GroupFault when the group fails under it."""
        if degrees.world != self.world:
            raise ValueError(f"degrees {degrees} need {degrees.world} ranks; this group has "
                             f"{self.world}")
        with self._lock:
            job.check_cancelled()
            self._ensure(degrees)
            assert self._conn is not None
            device = job.latents.device
            send(self._conn, "job", DenoiseJob(
                model=model, degrees=degrees, latents=job.latents.cpu(), sigmas=job.sigmas.cpu(),
                timesteps=job.timesteps.cpu(), positive=job.positive.cpu(),
                negative=None if job.negative is None else job.negative.cpu(),
                guidance=job.guidance))
            return self._drive(job, device)

    def _drive(self, job: Any, device: Any) -> Any:
        assert self._conn is not None
        while True:
            message = self._receive(f"step {job.step + 1} of {job.total}")
            if message[0] == "done":
                job.latents, self.last_report = message[1].to(device), message[2]
                return job.latents
            _, done, latents, velocity = message
            job.latents, job.velocity = latents.to(device), velocity.to(device)
            job.step, job.batch = done, 1
            try:
                job.on_progress(done, job.total)
                job.check_cancelled()
            except BaseException:
                self._stop_job()
                raise
            send(self._conn, "go")

    def _stop_job(self) -> None:
        """Tell rank 0 to stop after this step and wait until the group is idle again."""
        assert self._conn is not None
        try:
            send(self._conn, "stop")
            self._receive("stopping")
        except GroupFault:
            log.warning("the group failed while stopping a job; it restarts on the next job")

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


def _wait(proc: subprocess.Popen[bytes], seconds: float) -> None:
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=seconds)
