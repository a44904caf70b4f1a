"""FLUX.1 Fill through the flux1 family: the tiny Fill transformer (384 channels in) is told
apart by its weights, and the family's parts paint what diffusers' FluxFillPipeline paints."""

from __future__ import annotations

from pathlib import Path

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
