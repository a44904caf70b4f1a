"""A worker group of 2 gloo processes doing the real split on CPU: the same latents as one
process, jobs of several runs sharing each forward, progress and cancellation per step, a killed
or hung rank, two groups on one host."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Any

import pytest

from tests.workers.parallel.conftest import CFG, TOLERANCE, ULYSSES
from workers.faults import is_infrastructure_error
from workers.parallel.group import GroupFault, WorkerGroup
from workers.parallel.protocol import ModelRef
from workers.runners.base import RunCancelled


def max_error(a: Any, b: Any) -> float:
    return float((a - b).abs().max())


def test_a_sequence_split_over_two_ranks_gives_the_single_process_latents(
        ulysses_group: WorkerGroup, model_ref: ModelRef, single: Any,
        make_job: Callable[..., Any]) -> None:
    expected = single.batcher.run(make_job())
    got = ulysses_group.run(make_job(), model_ref, ULYSSES)
    assert max_error(got, expected) <= TOLERANCE
    # 64×48 px → 4×3 = 12 image tokens and 7 caption tokens, each padded to 32 by the
    # transformer: 64 tokens in the main layers, 32 on each rank.
    assert ulysses_group.last_report == {"tokens": 64, "local_tokens": 32}


def test_cfg_parallel_over_two_ranks_gives_the_single_process_latents(
        cfg_group: WorkerGroup, model_ref: ModelRef, single: Any,
        make_job: Callable[..., Any]) -> None:
    expected = single.batcher.run(make_job(guidance=4.0))
    got = cfg_group.run(make_job(guidance=4.0), model_ref, CFG)
    assert max_error(got, expected) <= TOLERANCE


MIXED: tuple[dict[str, Any], ...] = (
    {"width": 64, "height": 48, "steps": 4, "seed": 1},
    {"width": 48, "height": 64, "steps": 3, "seed": 2, "guidance": 4.0},
    {"width": 64, "height": 64, "steps": 5, "seed": 3},
)


@pytest.mark.parametrize("which", ["ulysses", "cfg"])
def test_jobs_of_several_runs_share_each_forward_and_each_matches_its_solo_render(
        which: str, ulysses_group: WorkerGroup, cfg_group: WorkerGroup, model_ref: ModelRef,
        single: Any, make_job: Callable[..., Any]) -> None:
    group, degrees = (ulysses_group, ULYSSES) if which == "ulysses" else (cfg_group, CFG)
    group.run(make_job(steps=1, guidance=4.0 if which == "cfg" else 0.0), model_ref, degrees)
    jobs = [make_job(**spec) for spec in MIXED]
    batches: list[int] = []
    for job in jobs:
        job.on_progress = lambda done, total, job=job: batches.append(job.batch)
    results: dict[int, Any] = {}
    before = group.forwards

    def render(i: int) -> None:
        results[i] = group.run(jobs[i], model_ref, degrees)

    threads = [threading.Thread(target=render, args=(i,)) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    # Different sizes, step counts and guidance (on the cfg pair the unguided jobs are computed
    # by both ranks): each ends where it ends alone in one process.
    for i, spec in enumerate(MIXED):
        assert max_error(results[i], single.batcher.run(make_job(**spec))) <= TOLERANCE, spec
    assert max(batches) > 1 and group.forwards - before < sum(s["steps"] for s in MIXED)


def test_every_step_comes_back_with_its_latents(
        ulysses_group: WorkerGroup, model_ref: ModelRef, make_job: Callable[..., Any]) -> None:
    job, seen = make_job(steps=3), []
    job.on_progress = lambda done, total: seen.append((done, total, job.latents.clone()))
    ulysses_group.run(job, model_ref, ULYSSES)
    assert [(done, total) for done, total, _ in seen] == [(1, 3), (2, 3), (3, 3)]
    assert job.step == 3 and job.velocity is not None
    assert max_error(seen[-1][2], job.latents) == 0.0


def test_a_cancel_stops_the_group_at_that_step_and_the_group_stays_up(
        ulysses_group: WorkerGroup, model_ref: ModelRef, single: Any,
        make_job: Callable[..., Any]) -> None:
    ulysses_group.run(make_job(steps=1), model_ref, ULYSSES)  # started
    pids, starts = ulysses_group.pids, ulysses_group.starts
    job = make_job(steps=6)

    def cancel_at_two() -> None:
        if job.step >= 2:
            raise RunCancelled("cancelled by the test")

    job.check_cancelled = cancel_at_two
    with pytest.raises(RunCancelled):
        ulysses_group.run(job, model_ref, ULYSSES)
    assert job.step == 2
    expected = single.batcher.run(make_job())
    assert max_error(ulysses_group.run(make_job(), model_ref, ULYSSES), expected) <= TOLERANCE
    assert (ulysses_group.pids, ulysses_group.starts) == (pids, starts)


def test_two_groups_on_one_host_have_their_own_ports_and_run_at_once(
        ulysses_group: WorkerGroup, cfg_group: WorkerGroup, model_ref: ModelRef, single: Any,
        make_job: Callable[..., Any]) -> None:
    results: dict[str, Any] = {}

    def render(name: str, group: WorkerGroup, degrees: Any, guidance: float) -> None:
        results[name] = group.run(make_job(guidance=guidance), model_ref, degrees)

    threads = [threading.Thread(target=render, args=("u", ulysses_group, ULYSSES, 0.0)),
               threading.Thread(target=render, args=("c", cfg_group, CFG, 4.0))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert ulysses_group.port and cfg_group.port and ulysses_group.port != cfg_group.port
    assert max_error(results["u"], single.batcher.run(make_job())) <= TOLERANCE
    assert max_error(results["c"], single.batcher.run(make_job(guidance=4.0))) <= TOLERANCE


def test_a_rank_killed_mid_job_fails_it_as_a_worker_fault_and_the_group_restarts(
        ulysses_group: WorkerGroup, model_ref: ModelRef, single: Any,
        make_job: Callable[..., Any]) -> None:
    ulysses_group.run(make_job(steps=1), model_ref, ULYSSES)
    old, starts, job = ulysses_group.pids, ulysses_group.starts, make_job(steps=6)

    def kill_rank_one_at_two(done: int, total: int) -> None:
        if done == 2:
            os.kill(old[1], signal.SIGKILL)

    job.on_progress = kill_rank_one_at_two
    with pytest.raises(GroupFault, match=r"rank 1 \(exit -9\)") as caught:
        ulysses_group.run(job, model_ref, ULYSSES)
    assert is_infrastructure_error(caught.value)  # the executor hands the run back: a retry
    assert not ulysses_group.alive and ulysses_group.port is None
    got = ulysses_group.run(make_job(), model_ref, ULYSSES)
    assert max_error(got, single.batcher.run(make_job())) <= TOLERANCE
    assert ulysses_group.starts == starts + 1 and set(ulysses_group.pids).isdisjoint(old)


def test_a_hung_rank_past_the_step_timeout_restarts_the_group(
        cfg_group: WorkerGroup, model_ref: ModelRef, make_job: Callable[..., Any]) -> None:
    cfg_group.run(make_job(steps=1, guidance=4.0), model_ref, CFG)
    old, job = cfg_group.pids, make_job(steps=6, guidance=4.0)

    def freeze_rank_one_at_two(done: int, total: int) -> None:
        if done == 2:
            os.kill(old[1], signal.SIGSTOP)

    job.on_progress = freeze_rank_one_at_two
    cfg_group.step_timeout = 2
    try:
        with pytest.raises(GroupFault, match=r"hung: no answer for 2s during a forward of 1 "
                                             r"job\(s\) \(step 3 of 6\)"):
            cfg_group.run(job, model_ref, CFG)
    finally:
        cfg_group.step_timeout = 60
    assert not cfg_group.alive
    with pytest.raises(ProcessLookupError):
        os.kill(old[1], 0)  # killed with the group, not left stopped


def test_a_group_worker_s_turbo_node_paints_what_a_single_worker_paints(
        ulysses_group: WorkerGroup, make_ctx: Callable[..., Any], smoke_stack: Any) -> None:
    import numpy as np

    from tests.workers.conftest import Recorder
    from workers.parallel.config import GroupSetup
    from workers.parallel.worker import configure
    from workers.runners import RUNNERS

    params = {"prompt": "a red kite", "negative_prompt": "", "width": 64, "height": 48,
              "steps": 3, "guidance": 0.0, "seed": 7, "strength": 0.6, "parallel": "2",
              **smoke_stack.names}
    alone = RUNNERS["zimage/turbo"](make_ctx(), params, {})["image"]
    configure(GroupSetup(2, ULYSSES), group=ulysses_group)
    try:
        recorder = Recorder()
        split = RUNNERS["zimage/turbo"](make_ctx(recorder), params, {})["image"]
    finally:
        configure(None)
    assert recorder.progress == [(1, 3), (2, 3), (3, 3)]
    diff = np.abs(np.asarray(split, dtype=int) - np.asarray(alone, dtype=int))
    assert diff.max() <= 1  # latents within TOLERANCE; a pixel may round the other way


def test_in_auto_mode_a_live_group_keeps_its_degrees_for_any_job(
        ulysses_group: WorkerGroup, model_ref: ModelRef, make_job: Callable[..., Any]) -> None:
    """A guided job on a live ulysses group is served as it is (both CFG halves on every rank),
    never by restarting the group as cfg=2; a group that is not running starts with cfg=2."""
    from workers.parallel import worker
    from workers.parallel.config import GroupSetup

    ulysses_group.run(make_job(steps=1), model_ref, ULYSSES)  # alive, as ulysses=2
    worker.configure(GroupSetup(2, None, nvlink=True), group=ulysses_group)
    try:
        assert worker._degrees([make_job(guidance=4.0)]) == ULYSSES
        stopped = WorkerGroup(2)
        worker.configure(GroupSetup(2, None, nvlink=True), group=stopped)
        assert worker._degrees([make_job(guidance=4.0), make_job()]) == CFG
        assert worker._degrees([make_job()]) == ULYSSES
    finally:
        worker.configure(None)
