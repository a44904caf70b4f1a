"""The step batcher: jobs of several threads share forwards, join and leave at step boundaries,
and each job's result matches its solo run up to float rounding."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch

from workers.models.zimage import engine, loading
from workers.runners.base import RunCancelled
from workers.sampling import SampleJob, StepBatcher


@pytest.fixture(scope="module")
def stack(smoke_stack, cpu_policy):
    names, d = smoke_stack.names, smoke_stack.models_dir
    model = loading.load_diffusion_model(d, names["model"], cpu_policy)
    encoder = loading.load_text_encoder(d, names["text_encoder"], cpu_policy)
    return model, encoder


def make_job(encoder, *, prompt, size, steps, seed, guidance=0.0, **callbacks):
    width, height = size
    sigmas, timesteps = engine.sigma_schedule(steps, width, height)
    latents = engine.noise(
        engine.latent_shape(width, height), torch.Generator("cpu").manual_seed(seed), "cpu"
    )
    negative = engine.encode_prompt(encoder, "") if guidance > 0 else None
    return SampleJob(
        latents, sigmas, timesteps, engine.encode_prompt(encoder, prompt), negative, guidance, **callbacks
    )


SPECS: list[dict[str, Any]] = [
    {"prompt": "a red fox", "size": (64, 48), "steps": 6, "seed": 1},
    {"prompt": "a lighthouse at dusk, long exposure", "size": (32, 32), "steps": 4, "seed": 2},
    {"prompt": "a cat", "size": (48, 64), "steps": 5, "seed": 3, "guidance": 2.0},
]


def slow_batcher(model, sizes: list[int]) -> StepBatcher:
    """A batcher over the real transformer whose forwards take long enough for others to join."""

    def predict(jobs):
        sizes.append(len(jobs))
        time.sleep(0.02)
        return engine.predict_velocity(model.transformer, jobs)

    return StepBatcher(predict, max_batch=4)


def run_in_threads(batcher, jobs):
    results: list[Any] = [None] * len(jobs)
    errors: list[BaseException | None] = [None] * len(jobs)

    def work(i):
        try:
            results[i] = batcher.run(jobs[i])
        except BaseException as exc:  # noqa: BLE001  (handed to the test to assert on)
            errors[i] = exc

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results, errors


def test_concurrent_jobs_share_forwards_and_match_their_solo_runs(stack):
    model, encoder = stack
    solo = [
        StepBatcher(lambda js: engine.predict_velocity(model.transformer, js)).run(make_job(encoder, **spec))
        for spec in SPECS
    ]
    sizes: list[int] = []
    progress: list[list[tuple[int, int]]] = [[] for _ in SPECS]
    jobs = [
        make_job(encoder, **spec, on_progress=lambda d, t, i=i: progress[i].append((d, t)))
        for i, spec in enumerate(SPECS)
    ]
    results, errors = run_in_threads(slow_batcher(model, sizes), jobs)
    assert errors == [None, None, None]
    assert max(sizes) > 1 and len(sizes) < sum(s["steps"] for s in SPECS)
    for alone, together in zip(solo, results, strict=True):
        assert torch.allclose(alone, together, atol=1e-5, rtol=0)
    for spec, seen in zip(SPECS, progress, strict=True):
        assert seen == [(i, spec["steps"]) for i in range(1, spec["steps"] + 1)]


def test_a_cancelled_job_leaves_the_batch_and_the_others_finish(stack):
    model, encoder = stack
    steps_seen: list[int] = []

    def cancel_after_two():
        if len(steps_seen) >= 2:
            raise RunCancelled("stop")

    victim = make_job(
        encoder, **SPECS[0], on_progress=lambda d, t: steps_seen.append(d), check_cancelled=cancel_after_two
    )
    survivor = make_job(encoder, **SPECS[1])
    expected = StepBatcher(lambda js: engine.predict_velocity(model.transformer, js)).run(
        make_job(encoder, **SPECS[1])
    )
    results, errors = run_in_threads(slow_batcher(model, []), [victim, survivor])
    assert isinstance(errors[0], RunCancelled) and steps_seen == [1, 2]
    assert errors[1] is None and torch.allclose(results[1], expected, atol=1e-5, rtol=0)


def test_a_failing_forward_fails_every_job_in_its_batch(stack):
    _, encoder = stack

    def broken(jobs):
        raise RuntimeError("device fell over")

    with pytest.raises(RuntimeError, match="device fell over"):
        StepBatcher(broken).run(make_job(encoder, **SPECS[1]))


def test_a_lost_device_fails_the_whole_batch_at_once_without_retrying_halves(stack):
    """A ConnectionError (a worker group's rank died) is the device, not a job: no forward on a
    half of the batch, every job gets the error (their runs are handed back and retried)."""
    model, encoder = stack
    calls: list[int] = []

    def predict(jobs):
        calls.append(len(jobs))
        if len(calls) > 1:
            raise ConnectionError("worker group rank died")
        time.sleep(0.05)  # the first forward: long enough for the others to line up
        return engine.predict_velocity(model.transformer, jobs)

    jobs = [make_job(encoder, **spec) for spec in SPECS]
    _, errors = run_in_threads(StepBatcher(predict), jobs)
    assert all(isinstance(e, ConnectionError) for e in errors), errors
    assert len(calls) == 2 and calls[1] > 1  # the failed forward was not retried on halves


def test_a_job_with_guidance_needs_negative_embeds(stack):
    _, encoder = stack
    job = make_job(encoder, **SPECS[1])
    with pytest.raises(ValueError, match="negative"):
        SampleJob(job.latents, job.sigmas, job.timesteps, job.positive, None, guidance=2.0)


def test_a_job_with_its_own_scheduler_step_is_advanced_by_it_in_a_shared_forward():
    """The batcher batches the forward only: each job's update is its own (`advance`), so a
    family with a stateful scheduler gives each job one, beside flow-matching jobs."""
    sizes: list[int] = []

    def predict(jobs):
        sizes.append(len(jobs))
        time.sleep(0.02)  # long enough for the other thread's job to join
        return [torch.ones_like(job.latents) for job in jobs]

    sigmas = torch.tensor([1.0, 0.75, 0.5, 0.0])
    timesteps = torch.tensor([1000.0, 750.0, 500.0])
    start = torch.zeros(1, 4, 2, 2)
    euler = SampleJob(start, sigmas, timesteps, torch.zeros(1, 1))
    own = SampleJob(start, sigmas, timesteps, torch.zeros(1, 1),
                    advance=lambda job, output: job.latents + 10 * output)
    results, errors = run_in_threads(StepBatcher(predict, max_batch=4), [euler, own])
    assert errors == [None, None]
    assert torch.equal(results[0], start - 1.0)  # Σ(σ_next − σ)·1 = 0 − 1
    assert torch.equal(results[1], start + 30.0)  # three steps of its own +10·1
    assert max(sizes) == 2
