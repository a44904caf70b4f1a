"""FLUX.1 Fill through the flux1 family: the tiny Fill transformer (384 channels in) is told
apart by its weights, and the family's parts paint what diffusers' FluxFillPipeline paints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from tests.workers.helpers import noise_image, png_bytes
from workers.models.catalog import scan

W, H, STEPS, GUIDANCE = 64, 48, 3, 2.5
PROMPT = "a lighthouse at dusk"


@pytest.fixture(scope="module")
def fill_stack(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    from workers.models.flux1.tiny import write_fill_transformer, write_smoke_stack

    models_dir = tmp_path_factory.mktemp("flux-fill-models")
    names = write_smoke_stack(models_dir)
    return models_dir, {**names, "fill": write_fill_transformer(models_dir)}


def square_mask() -> Image.Image:
    """White (repaint) over a square that crosses latent pixels' borders, black elsewhere."""
    mask = Image.new("L", (W, H), 0)
    ImageDraw.Draw(mask).rectangle((12, 9, 41, 30), fill=255)
    return mask


def test_the_fill_transformer_is_a_flux1_transformer_of_384_channels(fill_stack, cpu_policy):
    from workers.models.families import plugin
    from workers.models.flux1.engine import is_fill

    models_dir, names = fill_stack
    entry = {e["name"]: e for e in scan(models_dir)}[names["fill"]]
    assert (entry["family"], entry["role"]) == ("flux1", "transformer")
    flux = plugin("flux1")
    fill = flux.load_diffusion_model(models_dir, names["fill"], cpu_policy)
    plain = flux.load_diffusion_model(models_dir, names["model"], cpu_policy)
    assert is_fill(fill.transformer) and fill.transformer.config.out_channels == 64
    assert not is_fill(plain.transformer)


def test_the_family_parts_reproduce_flux_fill_pipeline(fill_stack, cpu_policy):
    from workers.models.families import plugin
    from workers.models.flux1.engine import fill_condition
    from workers.models.flux1.tiny import smoke_pipeline
    from workers.runners.diffusion import noise
    from workers.sampling import SampleJob

    models_dir, names = fill_stack
    flux = plugin("flux1")
    model = flux.load_diffusion_model(models_dir, names["fill"], cpu_policy)
    vae = flux.load_vae(models_dir, names["vae"], cpu_policy)
    encoder = flux.load_text_encoder(models_dir, [names["text_encoder"], names["text_encoder_2"]],
                                     cpu_policy)
    image, mask_image = noise_image(W, H), square_mask()
    mask = torch.from_numpy(np.array(mask_image)).float() / 255
    generator = torch.Generator("cpu").manual_seed(5)
    flux.encode_image(vae, image, generator)  # the pipeline's first draw (unused at strength 1)
    start = noise((1, 16, H // 8, W // 8), generator, "cpu")
    fill = fill_condition(vae, image, mask, generator)  # its third: the masked image
    sigmas, timesteps = flux.schedule(STEPS, W, H, 1.0)
    job = SampleJob(latents=start, sigmas=sigmas, timesteps=timesteps,
                    positive=flux.encode_prompts(encoder, [PROMPT])[0],
                    extra={"guidance": GUIDANCE, "fill": fill})
    ours = flux.decode_latents_batch(vae, [model.batcher.run(job)])[0]
    theirs = smoke_pipeline(fill=True)(
        PROMPT, image=image, mask_image=mask_image, height=H, width=W,
        num_inference_steps=STEPS, guidance_scale=GUIDANCE,
        generator=torch.Generator("cpu").manual_seed(5)).images[0]
    assert png_bytes(ours) == png_bytes(theirs)
    other = SampleJob(latents=start, sigmas=sigmas, timesteps=timesteps, positive=job.positive,
                      extra={"guidance": GUIDANCE})  # ComfyUI's default: nothing kept
    assert png_bytes(flux.decode_latents_batch(vae, [model.batcher.run(other)])[0]) != png_bytes(ours)


def test_a_mask_of_another_size_than_the_image_is_refused(fill_stack, cpu_policy):
    from workers.models.families import plugin
    from workers.models.flux1.engine import fill_condition

    models_dir, names = fill_stack
    flux = plugin("flux1")
    vae = flux.load_vae(models_dir, names["vae"], cpu_policy)
    with pytest.raises(ValueError, match="the mask is 32×48; the image 64×48"):
        fill_condition(vae, noise_image(W, H), torch.ones(H, 32))


def run(ctx: Any, node_type: str, params: dict[str, Any], inputs: dict[str, Any]) -> Any:
    from workers.runners import RUNNERS

    return RUNNERS[node_type](ctx, params, inputs)


def ramp_mask() -> Any:
    """Grey levels rising from 0 (keep) at the left to 1 (repaint) at the right."""
    from workers.models.values import Mask

    return Mask(np.tile(np.linspace(0.0, 1.0, W, dtype=np.float32), (H, 1)))


@pytest.fixture(scope="module")
def inpaint_parts(fill_stack: tuple[Path, dict[str, str]], cpu_policy: Any) -> dict[str, Any]:
    """The Fill model, and flux1/inpaint's prompt and latent for a noise image under ramp_mask."""
    from tests.workers.conftest import Recorder
    from workers.runners.base import NodeContext

    models_dir, names = fill_stack
    ctx = NodeContext(run_id="run-1", node_id="node-1", node_type="test", graph_sha256="0" * 64,
                      models_dir=models_dir, owner_id=1, policy=cpu_policy,
                      check_cancelled=Recorder().check_cancelled, report_progress=Recorder().record)
    model = run(ctx, "load/diffusion-model", {"file": names["fill"]}, {})["model"]
    vae = run(ctx, "load/vae", {"file": names["vae"]}, {})["vae"]
    encoder = run(ctx, "load/text-encoder", {"file": names["text_encoder_2"],
                                             "file_2": names["text_encoder"]}, {})["encoder"]
    positive = run(ctx, "encode/text", {"text": PROMPT}, {"encoder": encoder})["conditioning"]
    inpainted = run(ctx, "flux1/inpaint", {"noise_mask": True},
                    {"positive": positive, "vae": vae, "image": noise_image(W, H),
                     "mask": ramp_mask()})
    return {"ctx": ctx, "model": model, **inpainted}


def sampled(parts: dict[str, Any], model: Any) -> torch.Tensor:
    params = {"seed": 7, "steps": STEPS, "guidance": GUIDANCE, "denoise": 1.0, "shift": None}
    return run(parts["ctx"], "sample", params, {"model": model, "positive": parts["positive"],
                                                "latent": parts["latent"]})["latent"].samples


def comfyui_differential_inpaint(parts: dict[str, Any]) -> torch.Tensor:
    """ComfyUI's euler through KSamplerX0Inpaint with DifferentialDiffusion, written out: the
    threshold (t(σ) − t_to) / (t_from − t_to) with ModelSamplingFlux's t(σ) = σ and t_to its
    sigma_min (the schedule ends at 0), the kept part noised to σ in, the given latent out."""
    import math

    from workers.models.families import plugin
    from workers.models.flux1.engine import predict
    from workers.runners.diffusion import noise
    from workers.sampling import SampleJob

    flux, given, mask = plugin("flux1"), parts["latent"].samples, parts["latent"].mask
    mu = flux.model_sampling(W, H).shift
    sigma_min = torch.tensor(math.exp(mu) / (math.exp(mu) + (1 / (1 / 10000) - 1)))
    sigmas = flux.schedule(STEPS, W, H, 1.0)[0]
    eps = noise(tuple(given.shape), torch.Generator("cpu").manual_seed(7), "cpu")
    x = sigmas[0] * eps + (1 - sigmas[0]) * given
    for i in range(STEPS):
        s, s_next = sigmas[i], sigmas[i + 1]
        m = (mask >= (s - sigma_min) / (sigmas[0] - sigma_min)).float()
        x_in = x * m + (s * eps + (1 - s) * given) * (1 - m)
        job = SampleJob(latents=x_in, sigmas=sigmas[i:i + 2], timesteps=(s * 1000).expand(1),
                        positive=parts["positive"].embeds,
                        extra={"guidance": GUIDANCE, **parts["positive"].extra})
        x0 = (x_in - s * predict(parts["model"].transformer, [job])[0]) * m + given * (1 - m)
        x = x + (x - x0) / s * (s_next - s)
    return x


def test_flux1_inpaint_conditions_the_prompt_and_masks_the_image_s_latent(inpaint_parts):
    fill, latent = inpaint_parts["positive"].extra["fill"], inpaint_parts["latent"]
    assert tuple(fill.shape) == (1, 80, H // 8, W // 8)
    assert tuple(latent.samples.shape) == (1, 16, H // 8, W // 8)
    assert tuple(latent.mask.shape) == (1, 1, H // 8, W // 8)
    assert latent.mask[..., 0].max() < 0.1 and latent.mask[..., -1].min() > 0.9


def test_differential_diffusion_samples_as_comfyui_s_rule_step_by_step(inpaint_parts):
    dd = run(inpaint_parts["ctx"], "model/differential-diffusion", {"strength": 1.0},
             {"model": inpaint_parts["model"]})["model"]
    ours = sampled(inpaint_parts, dd)
    assert torch.equal(ours, comfyui_differential_inpaint(inpaint_parts))
    plain = sampled(inpaint_parts, inpaint_parts["model"])  # the grey mask blended as it is
    assert not torch.allclose(ours, plain, atol=1e-3)


def test_an_image_off_the_16_pixel_grid_is_inpainted_at_its_centre_on_it(inpaint_parts,
                                                                        fill_stack):
    """A 75×58 photo (a phone's crop) is cut to its 64×48 centre, its mask with it: the same
    condition and latent as the cut image and mask given whole."""
    ctx, positive = inpaint_parts["ctx"], inpaint_parts["positive"]
    from workers.models.values import Mask

    vae = run(ctx, "load/vae", {"file": fill_stack[1]["vae"]}, {})["vae"]
    big, cells = noise_image(75, 58), np.random.default_rng(3).random((58, 75), dtype=np.float32)
    off = run(ctx, "flux1/inpaint", {}, {"positive": positive, "vae": vae, "image": big,
                                         "mask": Mask(cells)})
    cut = run(ctx, "flux1/inpaint", {}, {"positive": positive, "vae": vae,
                                         "image": big.crop((5, 5, 69, 53)),
                                         "mask": Mask(cells[5:53, 5:69].copy())})
    assert tuple(off["latent"].samples.shape) == (1, 16, 6, 8)
    assert torch.equal(off["latent"].samples, cut["latent"].samples)
    assert torch.equal(off["latent"].mask, cut["latent"].mask)
    assert torch.equal(off["positive"].extra["fill"], cut["positive"].extra["fill"])


def test_an_image_smaller_than_the_grid_is_refused_by_name(inpaint_parts, fill_stack):
    from workers.models.values import Mask
    from workers.runners.base import NodeFailed

    ctx = inpaint_parts["ctx"]
    vae = run(ctx, "load/vae", {"file": fill_stack[1]["vae"]}, {})["vae"]
    with pytest.raises(NodeFailed, match=r"input 'image' is 12×40: FLUX\.1 inpaints images "
                                         r"of at least 16×16"):
        run(ctx, "flux1/inpaint", {}, {"positive": inpaint_parts["positive"], "vae": vae,
                                       "image": noise_image(12, 40),
                                       "mask": Mask(np.ones((40, 12), np.float32))})
