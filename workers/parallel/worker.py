"""A Celery worker as a group worker: the start check, the group it owns, the denoise hook.

At start (`celeryd_init`, before the worker consumes anything) INLINE_PARALLEL, the queues and
the GPUs are checked together (config.group_setup); a mismatch stops the worker with a message
that says what to change. A worker that serves `xfuser.<n>` then sends the denoise of every
SampleJob it runs to its group (`denoiser()`); loading, encoding and decoding stay in the
worker as on any other. On CPU (profile cpu, or simulated GPUs) the ranks are gloo processes;
on GPUs they are xfuser ranks, one per visible GPU.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
from typing import Any

from celery.signals import celeryd_init, worker_shutdown

from workers.counters import forwards_observer
from workers.parallel.config import Degrees, GroupSetup, ParallelConfigError, group_setup
from workers.parallel.group import WorkerGroup
from workers.parallel.protocol import ModelRef

log = logging.getLogger(__name__)

_lock = threading.Lock()
_state: dict[str, Any] = {}  # setup, backend, group


def configure(setup: GroupSetup | None, backend: str = "gloo",
              group: WorkerGroup | None = None) -> None:
    """Make this process a group worker with `setup` (None: an ordinary worker), optionally on
    an already running `group` of the same size."""
    with _lock:
        old = _state.get("group") if _state.get("owned") else None
        _state.clear()
        _state.update(setup=setup, backend=backend)
        if group is not None:
            _state["group"] = group
    if old is not None:
        old.close()


def denoiser() -> GroupDenoiser | None:
    """The group that denoises on this worker; None on an ordinary worker."""
    setup = _state.get("setup")
    return None if setup is None else GroupDenoiser(setup)


class GroupDenoiser:
    """What `_denoise` calls on a group worker instead of the model's own step batcher."""

    def __init__(self, setup: GroupSetup) -> None:
        self.setup = setup

    def run(self, ctx: Any, model: Any, job: Any) -> Any:
        """Denoise SampleJob `job` of `model` (a DiffusionModel) on the group, in one forward per
        step with the other slots' jobs of the same model (the group's step batcher, bounded as
        the model's own); its latents."""
        ref = ModelRef(models_dir=str(ctx.models_dir), name=model.name,
                       dtype=model.placement.dtype, attention=getattr(ctx.policy, "attention",
                                                                      "native"))
        own = model.batcher
        return _group().batcher(ref, _degrees, max_items=own.max_items, max_tokens=own.max_tokens,
                                observe=forwards_observer()).run(job)


def _degrees(jobs: list[Any]) -> Degrees:
    """The split of one forward: INLINE_PARALLEL's degrees when fixed. In auto mode a live group
    keeps the degrees it started with (any split computes any job: an unguided job on a cfg pair
    is computed by both ranks, a guided one on a sequence split carries both halves), so mixed
    traffic never restarts it; a group that starts picks cfg=2 when a job of its first forward is
    guided."""
    setup: GroupSetup = _state["setup"]
    group = _group()
    if setup.degrees is None and group.alive and group.degrees is not None:
        return group.degrees
    return setup.degrees_for(max(job.guidance for job in jobs))


def _group() -> WorkerGroup:
    with _lock:
        group = _state.get("group")
        if group is None:
            group = _state["group"] = WorkerGroup(_state["setup"].world, _state["backend"])
            _state["owned"] = True  # started here: closed here
        return group


# --- the Celery worker's start and end -------------------------------------------------------

@celeryd_init.connect
def _check_at_start(sender: str = "", options: dict[str, Any] | None = None, **_: Any) -> None:
    queues = (options or {}).get("queues") or []
    if isinstance(queues, str):
        queues = queues.split(",")
    if queues and all(q == "control" for q in queues):
        return  # the control worker runs no renders
    try:
        setup, backend = setup_from_env(list(queues))
    except ParallelConfigError as exc:
        # SystemExit passes Celery's signal dispatch (it catches Exception): the worker stops.
        raise SystemExit(f"inline farm worker {sender}: {exc}") from None
    configure(setup, backend)
    if setup is not None:
        log.info("worker %s is a group of %d (%s, %s)", sender, setup.world,
                 setup.degrees or "auto", backend)


@worker_shutdown.connect
def _close_group(**_: Any) -> None:
    group = _state.get("group")
    if group is not None:
        group.close()


def setup_from_env(queues: list[str], env: dict[str, str] | None = None) -> tuple[
        GroupSetup | None, str]:
    """(the group this worker runs, its backend) from INLINE_PARALLEL, its queues and GPUs."""
    source = os.environ if env is None else env
    gpus, nvlink = _visible_gpus(source)
    setup = group_setup(source.get("INLINE_PARALLEL"), queues, len(gpus), nvlink)
    backend = "xfuser" if gpus else "gloo"
    if setup is not None and backend == "xfuser" and importlib.util.find_spec("xfuser") is None:
        raise ParallelConfigError("a GPU group needs xfuser: pip install -e '.[parallel]' in this "
                                  "worker's environment")
    return setup, backend


def _visible_gpus(env: Any) -> tuple[list[Any], bool]:
    """The real GPUs this worker computes on, and whether they all have NVLink. None on the cpu
    profile or with simulated GPUs (INLINE_GPU_DESCRIPTION computes on CPU)."""
    if env.get("INLINE_PROFILE") == "cpu" or env.get("INLINE_GPU_DESCRIPTION", "").strip():
        return [], False
    from workers.device import nvml

    gpus = nvml.nvml_gpus()
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        wanted = [v.strip() for v in visible.split(",") if v.strip()]
        gpus = [g for g in gpus if str(g.index) in wanted] if all(
            w.isdigit() for w in wanted) else gpus[: len(wanted)]
    return gpus, bool(gpus) and all(g.nvlink > 0 for g in gpus)
