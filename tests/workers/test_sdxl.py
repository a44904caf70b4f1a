"""SDXL through the family seam: the tiny all-in-one checkpoint as studios download one, the
generic nodes against diffusers' StableDiffusionXLPipeline / …Img2ImgPipeline (epsilon and
v-prediction), and runs batching across threads."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.workers.conftest import Recorder
from tests.workers.helpers import noise_image, png_bytes
from workers.models.catalog import scan
from workers.runners import RUNNERS

W, H, STEPS, GUIDANCE = 64, 48, 3, 4.0  # the farm's guidance 4 is the pipeline's scale 5
PROMPT, NEGATIVE = "a lighthouse at dusk", "blurry"
PREDICTIONS = ["epsilon", "v_prediction"]


@pytest.fixture(scope="session")
def sdxl_stack(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """The smoke checkpoint (epsilon) and a v-prediction one beside it."""
    from workers.models.sdxl.tiny import write_smoke_stack

    models_dir = tmp_path_factory.mktemp("sdxl-models")
    names = {"epsilon": write_smoke_stack(models_dir)["checkpoint"],
             "v_prediction": write_smoke_stack(models_dir, v_pred=True,
                                               name="smoke-sdxl-vpred")["checkpoint"]}
    return models_dir, names


def pipeline(prediction: str, img2img: bool = False) -> Any:
    from workers.models.sdxl.tiny import smoke_pipeline

    return smoke_pipeline(img2img=img2img, v_pred=prediction == "v_prediction")


def chain(ctx: Any, checkpoint: str, *, seed: int = 7, guidance: float = GUIDANCE) -> Any:
    """load/checkpoint → encode ×2 → empty → sample → decode."""
    def run(node_type: str, params: dict[str, Any], inputs: dict[str, Any] | None = None) -> Any:
        return RUNNERS[node_type](ctx, params, inputs or {})

    loaded = run("load/checkpoint", {"file": checkpoint})
    positive = run("encode/text", {"text": PROMPT}, {"encoder": loaded["encoder"]})["conditioning"]
    negative = run("encode/text", {"text": NEGATIVE}, {"encoder": loaded["encoder"]})["conditioning"]
    empty = run("latent/empty", {"width": W, "height": H})["latent"]
    params = {"seed": seed, "steps": STEPS, "guidance": guidance, "denoise": 1.0}
    latent = run("sample", params, {"model": loaded["model"], "positive": positive,
                                    "negative": negative, "latent": empty})["latent"]
    return latent, run("vae/decode", {}, {"vae": loaded["vae"], "latent": latent})["image"]


def test_the_smoke_checkpoint_is_one_file_in_the_original_layout_recognised_from_contents(
        sdxl_stack, tmp_path, cpu_policy):
    from safetensors.torch import load_file, save_file

    from workers.models.sdxl import plugin as sdxl

    models_dir, names = sdxl_stack
    entries = {(e["folder"], e["name"]): e for e in scan(models_dir)}
    assert len(entries) == 2  # the .diffusers/ sidecar folders are not models
    for name in names.values():
        assert name.startswith("smoke-")
        entry = entries[("checkpoints", name)]
        assert (entry["family"], entry["role"]) == ("sdxl", "checkpoint")
    state = load_file(models_dir / "checkpoints" / names["epsilon"])
    prefixes = {k.split(".")[0] if not k.startswith("conditioner.") else ".".join(k.split(".")[:3])
                for k in state}
    assert prefixes == {"model", "first_stage_model", "conditioner.embedders.0",
                        "conditioner.embedders.1"}
    # The UNet and the VAE alone, as ComfyUI saves them (no prefix), under names that say
    # nothing; a tiny part's config beside it (a full-size one's is shipped).
    configs = models_dir / "checkpoints" / "smoke-sdxl.diffusers"
    for folder, prefix, part in (("diffusion_models", "model.diffusion_model.", "unet"),
                                 ("vae", "first_stage_model.", "vae")):
        (tmp_path / folder).mkdir()
        save_file({k.removeprefix(prefix): v for k, v in state.items() if k.startswith(prefix)},
                  tmp_path / folder / "part.safetensors")
        shutil.copy(configs / part / "config.json", tmp_path / folder / "part.config.json")
    alone = {e["folder"]: e for e in scan(tmp_path)}
    assert (alone["diffusion_models"]["family"], alone["diffusion_models"]["role"]) == ("sdxl", "unet")
    assert (alone["vae"]["family"], alone["vae"]["role"]) == ("sdxl", "vae")
    model, _, vae = sdxl.load_checkpoint(models_dir, names["epsilon"], cpu_policy)
    unet = sdxl.load_diffusion_model(tmp_path, "part.safetensors", cpu_policy).transformer
    assert all(torch.equal(a, b) for a, b in zip(unet.state_dict().values(),
                                                 model.transformer.state_dict().values(), strict=True))
    module = sdxl.load_vae(tmp_path, "part.safetensors", cpu_policy).module
    assert all(torch.equal(a, b) for a, b in zip(module.state_dict().values(),
                                                 vae.module.state_dict().values(), strict=True))


@pytest.mark.parametrize("prediction", PREDICTIONS)
def test_the_generic_nodes_paint_exactly_what_the_sdxl_pipeline_paints(sdxl_stack, make_ctx,
                                                                       prediction):
    models_dir, names = sdxl_stack
    _, image = chain(make_ctx(models_dir=models_dir), names[prediction])
    pipe = pipeline(prediction)
    reference = pipe(PROMPT, negative_prompt=NEGATIVE, height=H, width=W,
                     num_inference_steps=STEPS, guidance_scale=GUIDANCE + 1,
                     generator=torch.Generator("cpu").manual_seed(7))
    assert png_bytes(image) == png_bytes(reference.images[0])
    unguided = pipe(PROMPT, height=H, width=W, num_inference_steps=STEPS, guidance_scale=1.0,
                    generator=torch.Generator("cpu").manual_seed(7))
    assert png_bytes(image) != png_bytes(unguided.images[0])  # the guidance reaches the UNet
    assert png_bytes(chain(make_ctx(models_dir=models_dir), names[prediction], guidance=0.0)[1]) \
        == png_bytes(unguided.images[0])  # guidance 0: one forward, the pipeline's scale 1


def test_the_prediction_type_comes_from_the_checkpoint(sdxl_stack, cpu_policy):
    from workers.models.sdxl import plugin as sdxl

    models_dir, names = sdxl_stack
    loaded = {p: sdxl.load_checkpoint(models_dir, names[p], cpu_policy)[0]
              for p in PREDICTIONS}
    assert {p: m.transformer.prediction_type for p, m in loaded.items()} == {
        "epsilon": "epsilon", "v_prediction": "v_prediction"}


@pytest.mark.parametrize("prediction", PREDICTIONS)
def test_the_family_parts_reproduce_the_img2img_pipeline(sdxl_stack, cpu_policy, prediction):
    from workers.models.sdxl import plugin as sdxl
    from workers.runners.diffusion import noise
    from workers.sampling import SampleJob

    models_dir, names = sdxl_stack
    model, encoder, vae = sdxl.load_checkpoint(models_dir, names[prediction], cpu_policy)
    init, generator = noise_image(W, H), torch.Generator("cpu").manual_seed(5)
    sigmas, timesteps = sdxl.schedule(4, W, H, 0.6)
    start = sdxl.renoise(sdxl.encode_image(vae, init, generator),
                         noise((1, 4, H // 8, W // 8), generator, "cpu"), sigmas[0])
    positive, negative = (sdxl.encode_prompts(encoder, [text])[0] for text in (PROMPT, NEGATIVE))
    job = SampleJob(latents=start, sigmas=sigmas, timesteps=timesteps, positive=positive,
                    negative=negative, guidance=GUIDANCE, advance=sdxl.advance)
    ours = sdxl.decode_latents_batch(vae, [model.batcher.run(job)])[0]
    theirs = pipeline(prediction, img2img=True)(
        PROMPT, negative_prompt=NEGATIVE, image=init, strength=0.6, num_inference_steps=4,
        guidance_scale=GUIDANCE + 1, generator=torch.Generator("cpu").manual_seed(5)).images[0]
    assert len(timesteps) == 2  # strength 0.6 of 4 steps: the pipeline runs int(2.4) = 2
    assert png_bytes(ours) == png_bytes(theirs)


def test_to_denoised_is_the_x0_estimate_of_each_prediction_type():
    from workers.models.sdxl import plugin as sdxl
    from workers.sampling import SampleJob

    sigmas, timesteps = sdxl.schedule(4, W, H, 1.0)
    x, out = torch.randn(1, 4, 6, 8), torch.randn(1, 4, 6, 8)
    job = SampleJob(latents=x, sigmas=sigmas, timesteps=timesteps, positive=None, step=1)
    s = sigmas[1]
    assert torch.allclose(sdxl.to_denoised(job, out), x - s * out)
    job.extra["prediction"] = "v_prediction"
    assert torch.allclose(sdxl.to_denoised(job, out),
                          x / (s**2 + 1) - out * s / (s**2 + 1) ** 0.5, atol=1e-6)


def test_eight_concurrent_runs_share_forwards_and_each_matches_its_solo_run(sdxl_stack, make_ctx):
    models_dir, names = sdxl_stack
    solo = [chain(make_ctx(models_dir=models_dir), names["epsilon"], seed=s)[0].samples
            for s in range(8)]
    batches: list[int] = []
    results: dict[int, Any] = {}

    def one(seed: int) -> None:
        ctx = make_ctx(Recorder(batches=batches), models_dir=models_dir)
        results[seed] = chain(ctx, names["epsilon"], seed=seed)[0].samples

    threads = [threading.Thread(target=one, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(batches) > 1
    for seed in range(8):
        assert torch.allclose(results[seed], solo[seed], atol=1e-4), seed


def test_the_original_layout_is_what_diffusers_own_converters_read():
    """keys.py is the inverse of diffusers' single-file converters, part by part."""
    from diffusers.loaders.single_file_utils import (
        convert_ldm_clip_checkpoint,
        convert_ldm_unet_checkpoint,
        convert_ldm_vae_checkpoint,
        convert_open_clip_checkpoint,
    )

    from workers.models.sdxl import keys
    from workers.models.sdxl.tiny import build_tiny_components

    parts = build_tiny_components()
    state = keys.checkpoint(parts["unet"], parts["vae"], parts["text_encoder"],
                            parts["text_encoder_2"])
    unet, vae = parts["unet"], parts["vae"]
    pairs = [(convert_ldm_unet_checkpoint(state, unet.config), unet.state_dict()),
             (convert_ldm_vae_checkpoint(state, vae.config), vae.state_dict()),
             (convert_ldm_clip_checkpoint(state), _prefixed(parts["text_encoder"].state_dict())),
             (convert_open_clip_checkpoint(parts["text_encoder_2"], state,
                                           prefix="conditioner.embedders.1.model."),
              _prefixed(parts["text_encoder_2"].state_dict()))]
    for theirs, ours in pairs:
        ours = {k: v for k, v in ours.items() if not k.endswith("position_ids")}
        assert theirs.keys() == ours.keys()
        assert all(torch.equal(theirs[k], v) for k, v in ours.items())


def _prefixed(state: dict[str, Any]) -> dict[str, Any]:
    return {(k if k.startswith(("text_model.", "text_projection")) else f"text_model.{k}"): v
            for k, v in state.items()}


@pytest.mark.parametrize("prediction", PREDICTIONS)
@pytest.mark.parametrize("name", ["euler", "euler_ancestral", "heun", "dpmpp_2m"])
def test_comfyui_s_samplers_on_sdxl_step_on_its_to_denoised_as_comfyui_does(sdxl_stack, cpu_policy,
                                                                           prediction, name):
    """The generic samplers (workers/sampling/samplers.py) on SDXL's UNet, eps and v-prediction:
    ComfyUI's ModelSamplingDiscrete (karras over its β table, the nearest training timestep)
    and its algorithm, transcribed in tests/workers/comfy_reference.py, on the same denoiser."""
    from tests.workers import comfy_reference as ref
    from workers.models.sdxl import engine, plugin
    from workers.sampling import SampleJob, StepBatcher
    from workers.sampling.samplers import Stepper, eval_timesteps, plan
    from workers.sampling.schedulers import calculate_sigmas

    models_dir, names = sdxl_stack
    model, encoder, _ = plugin.load_checkpoint(models_dir, names[prediction], cpu_policy)
    positive, negative = engine.encode_prompts(encoder, [PROMPT, NEGATIVE])
    ms = plugin.model_sampling(W, H)
    sigmas, seed = calculate_sigmas(ms, "karras", 4), 7
    eps = torch.randn((1, 4, H // 8, W // 8), generator=torch.Generator().manual_seed(seed))
    x = ms.noise_scaling(sigmas[0], eps, torch.zeros(1), True)

    def denoiser(latents: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        sigma = sigma.reshape(()).float()
        job = SampleJob(latents, torch.stack([sigma, torch.tensor(0.0)]),
                        ms.model_timestep(sigma).reshape(1), positive, negative=negative,
                        guidance=GUIDANCE)
        return plugin.to_denoised(job, engine.predict(model.transformer, [job])[0])

    steps = plan(name, sigmas, ms)
    stepper = Stepper(name, sigmas, ms, seed, plugin.to_denoised)
    job = SampleJob(stepper.start(x), steps.sigmas, eval_timesteps(steps.sigmas, ms), positive,
                    negative=negative, guidance=GUIDANCE, advance=stepper.advance,
                    step_done=steps.step_done)
    ours = StepBatcher(lambda jobs: engine.predict(model.transformer, jobs)).run(job)
    theirs = ref.REFERENCE[name](denoiser, x, sigmas, ms, ref.default_noise_sampler(x, seed))
    assert torch.isfinite(ours).all()
    assert torch.allclose(ours, theirs, atol=1e-5, rtol=0), (ours - theirs).abs().max()

def test_the_shipped_configs_are_sdxl_base_s_full_size_models():
    """What a real checkpoint loads with: the parameter counts of SDXL base 1.0's parts."""
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    from workers.models.sdxl.loading import CONFIGS

    with torch.device("meta"):
        parts = [UNet2DConditionModel.from_config(UNet2DConditionModel.load_config(CONFIGS / "unet")),
                 AutoencoderKL.from_config(AutoencoderKL.load_config(CONFIGS / "vae")),
                 CLIPTextModel(CLIPTextConfig.from_pretrained(CONFIGS / "text_encoder")),
                 CLIPTextModelWithProjection(CLIPTextConfig.from_pretrained(
                     CONFIGS / "text_encoder_2"))]
    assert [sum(p.numel() for p in part.parameters()) for part in parts] == [
        2_567_463_684, 83_653_863, 123_060_480, 694_659_840]
