"""Sampling as parts (ComfyUI's custom sampling nodes) and the `sample` node's sampler and
scheduler, called as the executor calls them, on the tiny Z-Image stack."""

from __future__ import annotations

import pytest
import torch

from tests.workers.conftest import Recorder
from workers.runners import sampling  # noqa: F401  (registers the runners)
from workers.runners.base import RUNNERS, NodeFailed

W, H = 32, 32


def run(node_type, ctx, params=None, inputs=None):
    return RUNNERS[node_type](ctx, params or {}, inputs or {})


@pytest.fixture
def parts(smoke_stack, make_ctx):
    ctx = make_ctx()
    model = run("load/diffusion-model", ctx, {"file": smoke_stack.names["model"]})["model"]
    encoder = run("load/text-encoder", ctx, {"file": smoke_stack.names["text_encoder"]})["encoder"]
    positive = run("encode/text", ctx, {"text": "a red fox"}, {"encoder": encoder})["conditioning"]
    latent = run("latent/empty", ctx, {"width": W, "height": H})["latent"]
    return ctx, model, positive, latent


def sample(ctx, model, positive, latent, **params):
    base = {"seed": 3, "steps": 4, "guidance": 0.0, "denoise": 1.0}
    return run("sample", ctx, {**base, **params},
               {"model": model, "positive": positive, "latent": latent})["latent"].samples


def test_custom_advanced_is_the_sample_node_made_of_parts(parts):
    ctx, model, positive, latent = parts
    noise = run("sampling/noise", ctx, {"noise_seed": 3})["noise"]
    guider = run("sampling/cfg-guider", ctx, {"cfg": 2.5}, {"model": model, "positive": positive})
    sampler = run("sampling/sampler", ctx, {"sampler_name": "dpmpp_2m"})["sampler"]
    sigmas = run("sampling/scheduler", ctx, {"scheduler": "karras", "steps": 4, "denoise": 1.0},
                 {"model": model})["sigmas"]
    out = run("sampling/custom-advanced", ctx, {}, {
        "noise": noise, "guider": guider["guider"], "sampler": sampler, "sigmas": sigmas,
        "latent": latent})
    whole = sample(ctx, model, positive, latent, guidance=1.5, sampler="dpmpp_2m",
                   scheduler="karras")
    assert torch.equal(out["latent"].samples, whole)
    assert out["denoised"].samples.shape == whole.shape


def test_the_sample_nodes_default_stays_the_familys_own_and_euler_is_it_within_rounding(parts):
    ctx, model, positive, latent = parts
    own = sample(ctx, model, positive, latent)
    assert torch.equal(own, sample(ctx, model, positive, latent, sampler="default",
                                   scheduler="default"))
    generic = sample(ctx, model, positive, latent, sampler="euler")
    assert torch.allclose(own, generic, atol=1e-5, rtol=0)


def test_manual_sigmas_run_one_step_per_interval_and_report_steps(parts, make_ctx):
    _, model, positive, latent = parts
    recorder = Recorder()
    ctx = make_ctx(recorder)
    sigmas = run("sampling/manual-sigmas", ctx, {"sigmas": "1, 0.75, 0.4 0"})["sigmas"]
    guider = run("sampling/guider", ctx, {}, {"model": model, "conditioning": positive})["guider"]
    sampler = run("sampling/sampler", ctx, {"sampler_name": "heun"})["sampler"]
    noise = run("sampling/noise", ctx, {"noise_seed": 1})["noise"]
    out = run("sampling/custom-advanced", ctx, {}, {
        "noise": noise, "guider": guider, "sampler": sampler, "sigmas": sigmas, "latent": latent})
    assert torch.isfinite(out["latent"].samples).all()
    assert recorder.progress == [(1, 3), (2, 3), (3, 3)]  # steps, though heun evaluates 5 times


def test_sampler_custom_without_noise_ignores_the_seed(parts):
    ctx, model, positive, latent = parts
    sampler = run("sampling/sampler", ctx, {"sampler_name": "euler"})["sampler"]
    sigmas = run("sampling/manual-sigmas", ctx, {"sigmas": "0.5, 0.2, 0"})["sigmas"]

    def custom(seed, add_noise):
        return run("sampling/custom", ctx, {"add_noise": add_noise, "noise_seed": seed, "cfg": 1.0},
                   {"model": model, "positive": positive, "sampler": sampler, "sigmas": sigmas,
                    "latent": latent})["latent"].samples

    assert torch.equal(custom(1, False), custom(2, False))
    assert not torch.equal(custom(1, True), custom(2, True))


def test_sigmas_without_a_number_fail_the_node(make_ctx):
    with pytest.raises(NodeFailed, match="no number"):
        run("sampling/manual-sigmas", make_ctx(), {"sigmas": "one, two"})
