"""FLUX.1 through the family seam: the tiny stack as studios lay it out, the generic nodes
against diffusers' FluxPipeline / FluxImg2ImgPipeline, and runs batching across threads."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.workers.conftest import Recorder
from tests.workers.helpers import noise_image, png_bytes
from workers.models.catalog import scan
from workers.runners import RUNNERS

W, H, STEPS, GUIDANCE = 64, 48, 3, 2.5  # not the engine default (3.5)
PROMPT = "a lighthouse at dusk"


@pytest.fixture(scope="session")
def flux_stack(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    from workers.models.flux1.tiny import write_smoke_stack

    models_dir = tmp_path_factory.mktemp("flux-models")
    return models_dir, write_smoke_stack(models_dir)


@pytest.fixture(scope="session")
def flux_pipeline() -> Any:
    from workers.models.flux1.tiny import smoke_pipeline

    return smoke_pipeline()


def chain(ctx: Any, names: dict[str, str], *, seed: int = 7, prompt: str = PROMPT,
          shift: float | None = None, **sample_params: Any) -> Any:
    """load ×3 (T5 first, CLIP-L second: either order) → encode → empty → sample → decode."""
    def run(node_type: str, params: dict[str, Any], inputs: dict[str, Any] | None = None) -> Any:
        return RUNNERS[node_type](ctx, params, inputs or {})

    model = run("load/diffusion-model", {"file": names["model"]})["model"]
    vae = run("load/vae", {"file": names["vae"]})["vae"]
    encoder = run("load/text-encoder", {"file": names["text_encoder_2"],
                                        "file_2": names["text_encoder"]})["encoder"]
    positive = run("encode/text", {"text": prompt}, {"encoder": encoder})["conditioning"]
    empty = run("latent/empty", {"width": W, "height": H})["latent"]
    params = {"seed": seed, "steps": STEPS, "guidance": GUIDANCE, "denoise": 1.0, "shift": shift,
              **sample_params}
    latent = run("sample", params, {"model": model, "positive": positive, "latent": empty})["latent"]
    return latent, run("vae/decode", {}, {"vae": vae, "latent": latent})["image"]


def test_the_smoke_stack_is_laid_out_as_studios_have_it_and_recognised_from_contents(flux_stack):
    models_dir, names = flux_stack
    entries = {(e["folder"], e["name"]): e for e in scan(models_dir)}
    assert entries[("diffusion_models", names["model"])]["role"] == "transformer"
    assert entries[("diffusion_models", names["model"])]["family"] == "flux1"
    assert entries[("vae", names["vae"])]["families"] == ["flux1", "zimage"]  # FLUX's ae
    for role in ("text_encoder", "text_encoder_2"):
        assert entries[("text_encoders", names[role])]["family"] == "flux1"
    assert all(name.startswith("smoke-") for name in names.values())
    from safetensors import safe_open

    with safe_open(models_dir / "diffusion_models" / names["model"], "pt") as f:
        stored = f.keys()  # a safe_open is no mapping: keys() is its listing
    assert any(k.startswith("model.diffusion_model.double_blocks.") for k in stored)


def test_the_generic_nodes_paint_exactly_what_flux_pipeline_paints(flux_stack, make_ctx,
                                                                   flux_pipeline):
    models_dir, names = flux_stack
    _, image = chain(make_ctx(models_dir=models_dir), names)
    reference = flux_pipeline(PROMPT, height=H, width=W, num_inference_steps=STEPS,
                              guidance_scale=GUIDANCE, generator=torch.Generator("cpu").manual_seed(7))
    assert png_bytes(image) == png_bytes(reference.images[0])
    other = flux_pipeline(PROMPT, height=H, width=W, num_inference_steps=STEPS,
                          guidance_scale=1.0, generator=torch.Generator("cpu").manual_seed(7))
    assert png_bytes(image) != png_bytes(other.images[0])  # the guidance does reach the model


def test_the_sample_node_s_shift_is_the_scheduler_s_static_shift(flux_stack, make_ctx):
    """With `shift` α the generic nodes paint what FluxPipeline paints on a scheduler of static
    shift α (tests/workers/test_schedule_shift.py: ComfyUI's ModelSampling* sigmas)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    from workers.models.flux1.tiny import smoke_pipeline

    models_dir, names = flux_stack
    _, image = chain(make_ctx(models_dir=models_dir), names, shift=6.0)
    pipe = smoke_pipeline()
    pipe.scheduler = FlowMatchEulerDiscreteScheduler.from_config(
        pipe.scheduler.config, shift=6.0, use_dynamic_shifting=False)
    reference = pipe(PROMPT, height=H, width=W, num_inference_steps=STEPS, guidance_scale=GUIDANCE,
                     generator=torch.Generator("cpu").manual_seed(7)).images[0]
    assert png_bytes(image) == png_bytes(reference)
    _, default = chain(make_ctx(models_dir=models_dir), names)
    assert png_bytes(image) != png_bytes(default)


def test_the_family_parts_reproduce_the_img2img_pipeline(flux_stack, cpu_policy):
    from workers.models.families import plugin
    from workers.models.flux1.tiny import smoke_pipeline
    from workers.runners.diffusion import noise
    from workers.sampling import SampleJob

    models_dir, names = flux_stack
    flux = plugin("flux1")
    model = flux.load_diffusion_model(models_dir, names["model"], cpu_policy)
    vae = flux.load_vae(models_dir, names["vae"], cpu_policy)
    encoder = flux.load_text_encoder(models_dir, [names["text_encoder"], names["text_encoder_2"]],
                                     cpu_policy)
    init, generator = noise_image(W, H), torch.Generator("cpu").manual_seed(5)
    sigmas, timesteps = flux.schedule(4, W, H, 0.6)
    start = flux.renoise(flux.encode_image(vae, init, generator),
                         noise((1, 16, H // 8, W // 8), generator, "cpu"), sigmas[0])
    job = SampleJob(latents=start, sigmas=sigmas, timesteps=timesteps,
                    positive=flux.encode_prompts(encoder, [PROMPT])[0], extra={"guidance": 2.0})
    ours = flux.decode_latents_batch(vae, [model.batcher.run(job)])[0]
    theirs = smoke_pipeline(img2img=True)(
        PROMPT, image=init, height=H, width=W, strength=0.6, num_inference_steps=4,
        guidance_scale=2.0, generator=torch.Generator("cpu").manual_seed(5)).images[0]
    assert len(timesteps) == 3  # strength 0.6 of 4 steps: the pipeline skips int(1.6) = 1
    assert png_bytes(ours) == png_bytes(theirs)


def test_eight_concurrent_runs_share_forwards_and_each_matches_its_solo_run(flux_stack, make_ctx):
    models_dir, names = flux_stack
    solo = [chain(make_ctx(models_dir=models_dir), names, seed=s)[0].samples for s in range(8)]
    batches: list[int] = []
    results: dict[int, Any] = {}

    def one(seed: int) -> None:
        ctx = make_ctx(Recorder(batches=batches), models_dir=models_dir)
        results[seed] = chain(ctx, names, seed=seed)[0].samples

    threads = [threading.Thread(target=one, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(batches) > 1
    for seed in range(8):
        assert torch.allclose(results[seed], solo[seed], atol=1e-4), seed


def test_the_generic_euler_on_the_familys_sigmas_is_the_pipelines_sampler(flux_stack, make_ctx):
    """FLUX.1's to_denoised and timesteps: ComfyUI's euler over the family's own sigmas is its
    FlowMatchEuler within rounding; a ComfyUI scheduler (FLUX's resolution shift) differs."""
    models_dir, names = flux_stack
    ctx = make_ctx(models_dir=models_dir)
    own, _ = chain(ctx, names)
    generic, _ = chain(ctx, names, sampler="euler")
    assert torch.allclose(own.samples, generic.samples, atol=1e-5, rtol=0)
    karras, _ = chain(ctx, names, sampler="dpmpp_2m", scheduler="karras")
    assert torch.isfinite(karras.samples).all()
    assert (karras.samples - own.samples).abs().max() > 1e-2


def test_a_flux_conditioning_fed_to_a_z_image_model_fails_naming_both(flux_stack, smoke_stack,
                                                                        make_ctx):
    from workers.runners.base import NodeFailed

    models_dir, names = flux_stack
    ctx = make_ctx(models_dir=models_dir)
    encoder = RUNNERS["load/text-encoder"](ctx, {"file": names["text_encoder"],
                                                 "file_2": names["text_encoder_2"]}, {})["encoder"]
    positive = RUNNERS["encode/text"](ctx, {"text": "x"}, {"encoder": encoder})["conditioning"]
    zimage = RUNNERS["load/diffusion-model"](make_ctx(), {"file": smoke_stack.names["model"]},
                                             {})["model"]
    empty = RUNNERS["latent/empty"](ctx, {"width": W, "height": H}, {})["latent"]
    with pytest.raises(NodeFailed, match=r"flux1.*zimage"):
        RUNNERS["sample"](ctx, {"seed": 0, "steps": 1, "guidance": 0.0, "denoise": 1.0},
                          {"model": zimage, "positive": positive, "latent": empty})


def test_the_original_layout_is_what_diffusers_own_converter_reads():
    """keys.to_original is the inverse of diffusers' converter (which only reads full width:
    the single blocks' fused linear1 is cut at 3072, so those parts get that width here)."""
    from diffusers.loaders.single_file_utils import (
        convert_flux_transformer_checkpoint_to_diffusers,
    )

    from workers.models.flux1 import keys
    from workers.models.flux1.tiny import build_tiny_components

    state = dict(build_tiny_components()["transformer"].state_dict())
    for key in list(state):
        if key.startswith("single_transformer_blocks.") and (".attn.to_" in key or "proj_mlp" in key):
            rows = 4 * 3072 if "proj_mlp" in key else 3072
            state[key] = torch.randn(rows, *state[key].shape[1:])
    theirs = convert_flux_transformer_checkpoint_to_diffusers(dict(keys.to_original(state)))
    assert theirs.keys() == state.keys()
    assert all(torch.equal(theirs[k], v) for k, v in state.items())
    ours = keys.from_original(keys.to_original(state))
    assert all(torch.equal(ours[k], v) for k, v in state.items())
