"""The generic samplers (workers/sampling/samplers.py) against ComfyUI's own algorithms
(tests/workers/comfy_reference.py, transcribed as ComfyUI writes them), on the tiny Z-Image
transformer: the farm's sampler runs as a SampleJob in a StepBatcher (every evaluation one
forward, its state in the job's generator); the reference loops over the same denoiser function.
Then the schedulers against ComfyUI's formulas, and 4 samplers sharing forwards."""

from __future__ import annotations

import math

import pytest
import torch

from tests.workers import comfy_reference as ref
from tests.workers.helpers import wait_for
from tests.workers.test_step_batcher import run_in_threads
from workers.models.zimage import engine, loading, plugin
from workers.sampling import SampleJob, StepBatcher
from workers.sampling.samplers import BROWNIAN, SAMPLERS, Stepper, eval_timesteps, plan
from workers.sampling.schedulers import (
    DiscreteSampling,
    FlowSampling,
    beta_cdf,
    beta_ppf,
    calculate_sigmas,
    sigmas_for,
)

# Same ops in the same order on the same inputs: only a batched forward's reduction order may
# differ (float32, ~1e-7); a wrong coefficient or step is ~1e-2 and more.
ATOL = 1e-5
# A batched forward differs from the solo one by ~7e-7 (measured: float32 reduction order);
# uni_pc's third-order multistep corrector, ending at σ 0.001 and scaled up by its α, carries
# that to ~1.2e-5 in 4 steps on these 2 cores. A job sharing another's state is off by 1e-2.
BATCHED_ATOL = {"uni_pc": 5e-5}
SIZE = (32, 32)


@pytest.fixture(scope="module")
def model(smoke_stack, cpu_policy):
    return loading.load_diffusion_model(smoke_stack.models_dir, smoke_stack.names["model"],
                                        cpu_policy)


@pytest.fixture(scope="module")
def caption(smoke_stack, cpu_policy):
    encoder = loading.load_text_encoder(smoke_stack.models_dir,
                                        smoke_stack.names["text_encoder"], cpu_policy)
    return engine.encode_prompt(encoder, "a lighthouse at dusk")


def denoiser(model, caption):
    """ComfyUI's `model(x, σ)`: the family's forward at σ, as x0 (to_denoised)."""

    def call(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        sigma = sigma.reshape(()).float()
        job = SampleJob(x, torch.stack([sigma, torch.tensor(0.0)]), (sigma * 1000).reshape(1),
                        caption)
        return plugin.to_denoised(job, engine.predict_velocity(model.transformer, [job])[0])

    return call


def start_noise(seed: int) -> torch.Tensor:
    return engine.noise(engine.latent_shape(*SIZE), torch.Generator("cpu").manual_seed(seed), "cpu")


def sampler_job(name, sigmas, ms, seed, caption, **fields):
    steps = plan(name, sigmas, ms)
    stepper = Stepper(name, sigmas, ms, seed, plugin.to_denoised)
    x = stepper.start(ms.noise_scaling(sigmas[0], start_noise(seed), torch.zeros(1)))
    return SampleJob(x, steps.sigmas, eval_timesteps(steps.sigmas, ms), caption,
                     advance=stepper.advance, step_done=steps.step_done, **fields)


@pytest.mark.parametrize("name", SAMPLERS)
@pytest.mark.parametrize("scheduler", ["simple", "karras"])
def test_each_sampler_matches_comfyui_on_the_tiny_model(model, caption, name, scheduler):
    ms = FlowSampling(3.0)
    sigmas = calculate_sigmas(ms, scheduler, 5)
    seed = 7
    batcher = StepBatcher(lambda jobs: engine.predict_velocity(model.transformer, jobs))
    progress: list[tuple[int, int]] = []
    job = sampler_job(name, sigmas, ms, seed, caption,
                      on_progress=lambda done, total: progress.append((done, total)))
    ours = batcher.run(job)
    x = ms.noise_scaling(sigmas[0], start_noise(seed), torch.zeros(1))
    theirs = ref.REFERENCE[name](denoiser(model, caption), x, sigmas, ms,
                                 ref.noise_sampler_for(name, x, sigmas, seed))
    assert torch.isfinite(ours).all()
    assert torch.allclose(ours, theirs, atol=ATOL, rtol=0), (ours - theirs).abs().max()
    assert progress == [(i, 5) for i in range(1, 6)]  # steps, not evaluations
    assert batcher.forwards == job.total  # heun and dpmpp_sde: two forwards a step


def test_a_ksampler_path_with_a_different_seed_differs(model, caption):
    ms = FlowSampling(3.0)
    sigmas = calculate_sigmas(ms, "simple", 4)
    batcher = StepBatcher(lambda jobs: engine.predict_velocity(model.transformer, jobs))
    one = batcher.run(sampler_job("euler_ancestral", sigmas, ms, 1, caption))
    two = batcher.run(sampler_job("euler_ancestral", sigmas, ms, 2, caption))
    assert (one - two).abs().max() > 1e-2


@pytest.mark.parametrize("name", sorted(BROWNIAN))
def test_the_sde_samplers_draw_comfyuis_brownian_tree_not_white_noise(model, caption, name):
    """The same sampler stepped with the job's Gaussian generator instead: a different image
    (so the comparison above tells the tree's draws apart), and the tree follows the seed."""
    ms = FlowSampling(3.0)
    sigmas = calculate_sigmas(ms, "karras", 4)
    x = ms.noise_scaling(sigmas[0], start_noise(3), torch.zeros(1))
    tree = ref.REFERENCE[name](denoiser(model, caption), x, sigmas, ms,
                               ref.noise_sampler_for(name, x, sigmas, 3))
    white = ref.REFERENCE[name](denoiser(model, caption), x, sigmas, ms,
                                ref.default_noise_sampler(x, 3))
    other = ref.REFERENCE[name](denoiser(model, caption), x, sigmas, ms,
                                ref.noise_sampler_for(name, x, sigmas, 4))
    batcher = StepBatcher(lambda jobs: engine.predict_velocity(model.transformer, jobs))
    ours = batcher.run(sampler_job(name, sigmas, ms, 3, caption))
    assert torch.allclose(ours, tree, atol=ATOL, rtol=0)
    assert (tree - white).abs().max() > 1e-2 and (tree - other).abs().max() > 1e-2


def test_sde_jobs_sharing_forwards_each_keep_their_own_brownian_tree(model, caption):
    """Four SDE jobs (two samplers, three seeds) in one batcher: each its solo result."""
    specs = [("dpmpp_2m_sde", 1), ("dpmpp_2m_sde", 2), ("dpmpp_sde", 1), ("dpmpp_sde", 3)]
    ms = FlowSampling(3.0)
    sigmas = calculate_sigmas(ms, "karras", 4)
    solo_batcher = StepBatcher(lambda jobs: engine.predict_velocity(model.transformer, jobs))
    solo = [solo_batcher.run(sampler_job(n, sigmas, ms, seed, caption)) for n, seed in specs]
    sizes: list[int] = []

    def predict(jobs):
        if not sizes:
            wait_for(lambda: len(shared._active) == len(specs), 30, "all jobs inside")
        sizes.append(len(jobs))
        return engine.predict_velocity(model.transformer, jobs)

    shared = StepBatcher(predict, gather_seconds=60)
    results, errors = run_in_threads(shared, [sampler_job(n, sigmas, ms, seed, caption)
                                              for n, seed in specs])
    assert errors == [None] * 4 and max(sizes) == 4
    for spec, alone, together in zip(specs, solo, results, strict=True):
        assert torch.allclose(alone, together, atol=ATOL, rtol=0), spec
    assert (solo[0] - solo[1]).abs().max() > 1e-2  # the seeds' trees differ


def test_four_samplers_share_forwards_and_match_their_solo_runs(model, caption):
    names = ["euler", "heun", "dpmpp_2m_sde", "uni_pc"]
    ms = FlowSampling(3.0)
    sigmas = calculate_sigmas(ms, "normal", 4)
    solo_batcher = StepBatcher(lambda jobs: engine.predict_velocity(model.transformer, jobs))
    solo = [solo_batcher.run(sampler_job(n, sigmas, ms, i, caption)) for i, n in enumerate(names)]
    sizes: list[int] = []

    def predict(jobs):
        if not sizes:  # the jobs meet by this condition, whatever the threads' timing
            wait_for(lambda: len(shared._active) == len(names), 30, "all jobs inside")
        sizes.append(len(jobs))
        return engine.predict_velocity(model.transformer, jobs)

    shared = StepBatcher(predict, gather_seconds=60)  # then waits for every running job
    jobs = [sampler_job(n, sigmas, ms, i, caption) for i, n in enumerate(names)]
    results, errors = run_in_threads(shared, jobs)
    assert errors == [None] * 4
    assert max(sizes) == 4 and len(sizes) < sum(job.total for job in jobs)
    for name, alone, together in zip(names, solo, results, strict=True):
        diff = ((alone - together).abs() / alone.abs().clamp(min=1)).max()
        assert diff < BATCHED_ATOL.get(name, ATOL), (name, diff)


# --- schedulers: ComfyUI's formulas (comfy/samplers.py, comfy/model_sampling.py) --------------


def comfy_flow_sigmas(shift: float) -> torch.Tensor:
    t = torch.arange(1, 1001, 1) / 1000
    return shift * t / (1 + (shift - 1) * t)


def test_simple_and_normal_follow_comfyui_on_the_flow_table():
    ms, table = FlowSampling(3.0), comfy_flow_sigmas(3.0)
    simple = [float(table[-(1 + int(x * 1000 / 8))]) for x in range(8)] + [0.0]
    assert calculate_sigmas(ms, "simple", 8).tolist() == torch.FloatTensor(simple).tolist()
    start, end = float(table[-1]), float(table[0])
    ts = torch.linspace(start, end, 8)
    normal = [3.0 * float(t) / (1 + 2.0 * float(t)) for t in ts] + [0.0]
    assert torch.allclose(calculate_sigmas(ms, "normal", 8), torch.FloatTensor(normal), atol=1e-6)
    sgm = torch.linspace(start, end, 9)[:-1]
    expected = [3.0 * float(t) / (1 + 2.0 * float(t)) for t in sgm] + [0.0]
    assert torch.allclose(calculate_sigmas(ms, "sgm_uniform", 8), torch.FloatTensor(expected),
                          atol=1e-6)


def test_karras_and_exponential_span_the_model_sigmas():
    ms = FlowSampling(3.0)
    lo, hi = ms.sigma_min, ms.sigma_max
    karras = calculate_sigmas(ms, "karras", 6)
    rho = 7.0
    ramp = torch.linspace(0, 1, 6)
    expected = (hi ** (1 / rho) + ramp * (lo ** (1 / rho) - hi ** (1 / rho))) ** rho
    assert torch.equal(karras[:-1], expected) and karras[-1] == 0
    expo = calculate_sigmas(ms, "exponential", 6)
    assert torch.equal(expo[:-1], torch.linspace(math.log(hi), math.log(lo), 6).exp())
    assert hi == 1.0 and abs(lo - 3 * 0.001 / (1 + 2 * 0.001)) < 1e-7


def test_beta_scheduler_reads_the_table_at_the_beta_quantiles():
    assert abs(beta_cdf(beta_ppf(0.3, 0.6, 0.6), 0.6, 0.6) - 0.3) < 1e-12
    assert abs(beta_ppf(0.5, 0.6, 0.6) - 0.5) < 1e-12  # symmetric
    # I_x(1, 1) = x, I_x(2, 1) = x², I_x(½, ½) = (2/π)·asin(√x) (closed forms; a < 1 too)
    assert abs(beta_ppf(0.25, 1, 1) - 0.25) < 1e-12 and abs(beta_ppf(0.25, 2, 1) - 0.5) < 1e-12
    for x in (0.01, 0.3, 0.77, 0.999):
        assert abs(beta_cdf(x, 0.5, 0.5) - 2 / math.pi * math.asin(math.sqrt(x))) < 1e-12
    ms = FlowSampling(3.0)
    table = ms.sigmas
    sigmas = calculate_sigmas(ms, "beta", 5)
    picks = [round(beta_ppf(1 - i / 5, 0.6, 0.6) * 999) for i in range(5)]
    assert sigmas.tolist() == torch.FloatTensor([float(table[p]) for p in picks] + [0.0]).tolist()


def test_flux_shift_and_denoise_take_the_tail_of_a_longer_schedule():
    flux = FlowSampling(1.15, flux=True)
    assert len(flux.sigmas) == 10000 and flux.sigma_max == 1.0
    full = calculate_sigmas(flux, "simple", 10)
    assert torch.equal(sigmas_for(flux, "simple", 5, 0.5), full[-6:])
    assert FlowSampling(6.0).sigmas[500] > FlowSampling(3.0).sigmas[500]  # the flow shift


def test_discrete_sampling_is_sdxls_table():
    ms = DiscreteSampling()
    assert ms.sigmas.shape == (1000,) and abs(ms.sigma_max - 14.6146) < 1e-3
    karras = calculate_sigmas(ms, "karras", 4)
    assert abs(float(karras[0]) - ms.sigma_max) < 1e-4 and karras[-1] == 0
