"""Cross-run batching in one worker process: bounds, admission, isolation (failures, OOM) and the
batched text encodes and VAE decodes, on the tiny Z-Image stack on CPU."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from tests.workers.helpers import pixels, wait_for
from tests.workers.test_step_batcher import make_job, run_in_threads
from workers.models.zimage import engine, loading
from workers.sampling import Coalescer, SampleJob, StepBatcher

# Batched vs solo: the same math over differently shaped matmuls, so only the reduction order
# (float32 rounding, ~1e-7 relative per op) may differ; 1e-5 absolute on unit-variance latents
# is two orders above what we measure (~2e-7) and far below any real difference (~1e-1).
ATOL = 1e-5

MIXED: list[dict[str, Any]] = [
    {"prompt": "a red fox", "size": (64, 48), "steps": 6, "seed": 1},
    {"prompt": "a lighthouse at dusk, long exposure", "size": (32, 32), "steps": 4, "seed": 2},
    {"prompt": "a cat", "size": (48, 64), "steps": 5, "seed": 3, "guidance": 2.0},
    {"prompt": "rain on a window", "size": (32, 48), "steps": 3, "seed": 4},
    {"prompt": "a red fox", "size": (64, 48), "steps": 6, "seed": 5, "guidance": 1.5},
]


@pytest.fixture(scope="module")
def stack(smoke_stack, cpu_policy):
    names, d = smoke_stack.names, smoke_stack.models_dir
    model = loading.load_diffusion_model(d, names["model"], cpu_policy)
    encoder = loading.load_text_encoder(d, names["text_encoder"], cpu_policy)
    vae = loading.load_vae(d, names["vae"], cpu_policy)
    return model, encoder, vae


@pytest.fixture(scope="module")
def solo(stack) -> list[torch.Tensor]:
    model, encoder, _ = stack
    alone = StepBatcher(lambda js: engine.predict_velocity(model.transformer, js))
    return [alone.run(make_job(encoder, **spec)) for spec in MIXED]


class Recording:
    """The real forward, recording each batch in `seen`; `fail(jobs)` may raise to simulate a
    broken forward. Its first forward waits until every job is inside its batcher, and the
    batcher waits for every running job before each forward after it: the jobs meet by those
    conditions, whatever the threads' timing (a sleep in the forward used to make it likely)."""

    def __init__(self, model: Any, seen: list[list[SampleJob]], *,
                 fail: Callable[[list[SampleJob]], None] = lambda jobs: None) -> None:
        self.model, self.seen, self.fail = model, seen, fail
        self.batcher: StepBatcher | None = None

    def batcher_with(self, **bounds: Any) -> StepBatcher:
        self.batcher = StepBatcher(self, gather_seconds=60, **bounds)
        return self.batcher

    def __call__(self, jobs: list[SampleJob]) -> list[torch.Tensor]:
        if not self.seen:
            wait_for(self.all_inside, 30, f"all {len(MIXED)} jobs inside the batcher")
        self.fail(jobs)
        self.seen.append(list(jobs))
        return engine.predict_velocity(self.model.transformer, jobs)

    def all_inside(self) -> bool:
        assert self.batcher is not None
        return len(self.batcher._active) >= len(MIXED)


def test_jobs_of_mixed_sizes_steps_and_guidance_share_forwards_and_match_their_solo_runs(
    stack, solo
):
    model, encoder, _ = stack
    seen: list[list[SampleJob]] = []
    batches: list[list[int]] = [[] for _ in MIXED]
    jobs = [make_job(encoder, **spec) for spec in MIXED]
    for i, job in enumerate(jobs):
        job.on_progress = lambda d, t, i=i, job=job: batches[i].append(job.batch)
    results, errors = run_in_threads(Recording(model, seen).batcher_with(), jobs)
    assert errors == [None] * len(MIXED)
    assert len(seen) < sum(s["steps"] for s in MIXED) and max(map(len, seen)) > 2
    assert any(job.cfg for batch in seen if len(batch) > 1 for job in batch)  # CFG halves mix in
    for alone, together in zip(solo, results, strict=True):
        assert (alone - together).abs().max().item() <= ATOL
    assert all(len(b) == s["steps"] for b, s in zip(batches, MIXED, strict=True))
    assert max(max(b) for b in batches) > 1  # progress tells how many shared the forward


def test_a_forward_never_exceeds_the_item_and_token_bounds_and_big_jobs_wait_their_turn(
    stack, solo
):
    model, encoder, _ = stack
    seen: list[list[SampleJob]] = []
    bound_tokens = 2 * 24 * 32  # the CFG job alone (2 × 24·32 tokens) fills it
    batcher = Recording(model, seen).batcher_with(max_items=3, max_tokens=bound_tokens)
    results, errors = run_in_threads(batcher, [make_job(encoder, **spec) for spec in MIXED])
    assert errors == [None] * len(MIXED)
    for batch in seen:
        assert sum(j.items for j in batch) <= 3 or len(batch) == 1
        assert sum(j.tokens for j in batch) <= bound_tokens or len(batch) == 1
    for alone, together in zip(solo, results, strict=True):
        assert (alone - together).abs().max().item() <= ATOL


def test_a_lone_job_never_waits_for_company_and_is_stepped_bit_for_bit(stack, solo):
    model, encoder, _ = stack
    # An admission rule that waited for company would hang here for an hour per step.
    batcher = StepBatcher(lambda js: engine.predict_velocity(model.transformer, js),
                          gather_seconds=3600)
    done: list[torch.Tensor] = []
    worker = threading.Thread(target=lambda: done.append(batcher.run(make_job(encoder, **MIXED[0]))))
    worker.start()
    worker.join(timeout=60)
    assert done and torch.equal(done[0], solo[0])
    assert batcher.forwards == MIXED[0]["steps"] and set(batcher.sizes) == {1}


def test_an_out_of_memory_batch_is_retried_smaller_and_every_job_finishes_right(stack, solo):
    model, encoder, _ = stack

    def too_big(jobs: list[SampleJob]) -> None:
        if sum(j.items for j in jobs) > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")

    seen: list[list[SampleJob]] = []
    batcher = Recording(model, seen, fail=too_big).batcher_with()
    results, errors = run_in_threads(batcher, [make_job(encoder, **spec) for spec in MIXED])
    assert errors == [None] * len(MIXED)
    assert all(sum(j.items for j in batch) <= 2 for batch in seen)
    assert batcher._oom_items is not None and batcher._oom_items <= 2  # later batches start small
    for alone, together in zip(solo, results, strict=True):
        assert (alone - together).abs().max().item() <= ATOL


def test_a_job_whose_forward_fails_fails_alone_and_its_batch_mates_finish(stack, solo):
    model, encoder, _ = stack
    jobs = [make_job(encoder, **spec) for spec in MIXED]
    poisoned = jobs[2]

    def poison(batch: list[SampleJob]) -> None:
        if poisoned in batch and poisoned.step == 1:
            raise RuntimeError("NaN in the caption (simulated)")

    results, errors = run_in_threads(Recording(model, [], fail=poison).batcher_with(), jobs)
    assert isinstance(errors[2], RuntimeError) and poisoned.step == 1
    for i, (alone, together) in enumerate(zip(solo, results, strict=True)):
        if i != 2:
            assert errors[i] is None and (alone - together).abs().max().item() <= ATOL


# --- batched text encodes and VAE decodes --------------------------------------------------


def coalesced(fn: Callable[[list[Any]], list[Any]], total: int, **options: Any) -> Coalescer:
    """A Coalescer of `fn` whose first call waits until the other `total` - 1 requests (minus
    those it took) are pending: they meet in the calls after it, whatever the threads' timing
    (a sleep in `fn` used to make that likely)."""
    first: list[int] = []

    def held(batch: list[Any]) -> list[Any]:
        if not first:
            first.append(len(batch))
            wait_for(lambda: first[0] + len(coalescer._pending) >= total, 30,
                     f"all {total} requests pending")
        return fn(batch)

    coalescer: Coalescer = Coalescer(held, **options)
    return coalescer


def call_together(coalescer: Coalescer, items: list[Any]) -> list[Any]:
    """Call from one thread per item, started together."""
    out: list[Any] = [None] * len(items)
    gate = threading.Barrier(len(items))

    def work(i: int) -> None:
        gate.wait()
        out[i] = coalescer.call(items[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(items))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return out


def test_text_encodes_that_arrive_together_share_one_encoder_call(stack):
    _, encoder, _ = stack
    texts = ["a red fox", "", "a lighthouse at dusk, long exposure", "a cat", "rain"]
    calls: list[int] = []

    def encode(batch: list[str]) -> list[torch.Tensor]:
        calls.append(len(batch))
        return engine.encode_prompts(encoder, batch)

    together = call_together(coalesced(encode, len(texts)), texts)
    assert len(calls) < len(texts) and max(calls) > 1
    for text, embeds in zip(texts, together, strict=True):
        alone = engine.encode_prompt(encoder, text)
        assert embeds.shape == alone.shape and (embeds - alone).abs().max().item() <= ATOL


def test_vae_decodes_batch_by_latent_shape_within_the_bounds(stack):
    _, _, vae = stack
    shapes = [(48, 64), (48, 64), (32, 32), (48, 64), (32, 32)]
    latents = [engine.noise((1, 16, h // 8, w // 8), torch.Generator("cpu").manual_seed(i), "cpu")
               for i, (h, w) in enumerate(shapes)]
    calls: list[list[tuple[int, ...]]] = []

    def decode(batch: list[torch.Tensor]) -> list[Any]:
        calls.append([tuple(x.shape) for x in batch])
        return engine.decode_latents_batch(vae, batch)

    coalescer = coalesced(decode, len(latents), max_items=2, key=lambda x: tuple(x.shape))
    images = call_together(coalescer, latents)
    assert all(len(set(call)) == 1 and len(call) <= 2 for call in calls)
    assert any(len(call) == 2 for call in calls)
    for x, image in zip(latents, images, strict=True):
        alone, got = pixels(engine.decode_latents(vae, x)), pixels(image)
        assert np.abs(alone - got).max() <= 1  # a rounding flip of one 8-bit level at most


def test_a_failing_request_fails_alone_in_its_batch(stack):
    calls: list[list[str]] = []

    def encode(batch: list[str]) -> list[str]:
        calls.append(list(batch))
        if "boom" in batch:
            raise ValueError("cannot encode boom")
        return [t.upper() for t in batch]

    texts = ["a", "b", "boom", "c"]
    coalescer: Coalescer[str, str] = coalesced(encode, len(texts))
    out: dict[str, Any] = {}

    def work(text: str) -> None:
        try:
            out[text] = coalescer.call(text)
        except ValueError as exc:
            out[text] = exc

    threads = [threading.Thread(target=work, args=(t,)) for t in texts]
    threads[0].start()  # "a" alone: its call holds until the three others wait, together
    wait_for(lambda: coalescer._driving, 30, "the call for \"a\" under way")
    for t in threads[1:]:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert calls[0] == ["a"] and sorted(calls[1]) == ["b", "boom", "c"]  # a shared call failed
    assert isinstance(out["boom"], ValueError)
    assert {k: v for k, v in out.items() if k != "boom"} == {"a": "A", "b": "B", "c": "C"}


def test_the_device_policy_bounds_every_batch():
    from workers.device.policy import DevicePolicy

    cpu = DevicePolicy(profile="cpu").batch_bounds()
    assert cpu.items >= 8 and cpu.tokens >= 8 * 1024
    assert DevicePolicy(profile="cpu", batch_items=3, batch_tokens=100).batch_bounds() == (
        type(cpu)(3, 100))
    big = DevicePolicy(profile="gpu-max", device="cuda:0", vram_gb=80).batch_bounds()
    assert big.tokens >= 16 * 4096  # sixteen 1024² items
    with pytest.raises(ValueError):
        type(cpu)(0, 1)


def test_the_batch_bounds_come_from_the_environment():
    from workers.device.detect import policy_from_env

    env = {"INLINE_PROFILE": "cpu", "INLINE_BATCH_ITEMS": "3", "INLINE_BATCH_TOKENS": "2048"}
    policy = policy_from_env(env)
    assert (policy.batch_bounds().items, policy.batch_bounds().tokens) == (3, 2048)
    assert policy.describe()["batch_items"] == 3  # what the worker reports in its heartbeat
    default = policy_from_env({"INLINE_PROFILE": "cpu", "INLINE_BATCH_ITEMS": "0"})
    assert default.batch_bounds() == policy_from_env({"INLINE_PROFILE": "cpu"}).batch_bounds()
    for bad in ("-1", "many", "2.5"):
        with pytest.raises(ValueError, match="INLINE_BATCH_ITEMS must be a whole number"):
            policy_from_env({"INLINE_PROFILE": "cpu", "INLINE_BATCH_ITEMS": bad})
