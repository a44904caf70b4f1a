"""LTX-2's latent upsampler (the two-stage workflows' LatentUpscaleModelLoader +
LTXVLatentUpsampler): the tiny file in latent_upscale_models/ recognised as LTX-2's, a sampled
clip upsampled by the nodes equal to diffusers' LTX2LatentUpsamplePipeline over the same net and
VAE (latents and decoded frames), its sound kept, and clear errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.workers.test_ltx2_nodes import FPS, FRAMES, GUIDANCE, PROMPT, STEPS, H, W, run
from workers.models.catalog import scan


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    from workers.models.ltx2.plugin import write_tiny_stack

    models_dir = tmp_path_factory.mktemp("ltx2-upsampler")
    written = write_tiny_stack(models_dir)  # `./farm models smoke`'s: the upsampler too
    return models_dir, written["checkpoint"], written["latent_upscaler"]


def sampled(ctx: Any, name: str) -> tuple[dict[str, Any], Any]:
    parts = run(ctx, "load/checkpoint", {"file": name})
    positive = run(ctx, "encode/text", {"text": PROMPT}, {"encoder": parts["encoder"]})
    latent = run(ctx, "ltx2/empty-latent", {"width": W, "height": H, "length": FRAMES,
                                            "fps": FPS})["latent"]
    out = run(ctx, "ltx2/sample", {"seed": 5, "steps": STEPS, **GUIDANCE},
              {"model": parts["model"], "positive": positive["conditioning"], "latent": latent})
    return parts, out["latent"]


def test_the_upsampler_file_is_ltx2_s(stack):
    models_dir, _, upsampler = stack
    [entry] = [e for e in scan(models_dir) if e["folder"] == "latent_upscale_models"]
    assert (entry["name"], entry["family"], entry["role"]) == (upsampler, "ltx2",
                                                               "latent_upscaler")


def test_an_upsampled_clip_is_the_latent_upsample_pipeline_s(stack, make_ctx):
    from diffusers import LTX2LatentUpsamplePipeline
    from diffusers.pipelines.ltx2.pipeline_ltx2 import LTX2Pipeline

    from workers.models.ltx2.plugin import components_of

    models_dir, name, upsampler = stack
    ctx = make_ctx(models_dir=models_dir)
    parts, latent = sampled(ctx, name)
    model = run(ctx, "load/latent-upscale-model", {"file": upsampler})["latent_upscale_model"]
    up = run(ctx, "ltx2/upsample-latent", {}, {"latent": latent, "latent_upscale_model": model,
                                                "vae": parts["vae"]})["latent"]
    assert up.samples.shape == (*latent.samples.shape[:3], 2 * latent.samples.shape[3],
                                2 * latent.samples.shape[4])
    assert up.pixel_size == (2 * W, 2 * H) and up.audio is latent.audio and up.fps == FPS
    vae = components_of(parts["model"].transformer)["vae"]
    pipe: Any = LTX2LatentUpsamplePipeline(vae=vae, latent_upsampler=model.net)
    pipe.set_progress_bar_config(disable=True)
    want = pipe(latents=latent.samples, latents_normalized=True, height=H, width=W,
                num_frames=FRAMES, output_type="latent", return_dict=False)[0]
    want = LTX2Pipeline._normalize_latents(want, vae.latents_mean, vae.latents_std,
                                           vae.config.scaling_factor)
    torch.testing.assert_close(up.samples, want, rtol=0, atol=1e-6)
    frames = pipe(latents=latent.samples, latents_normalized=True, height=H, width=W,
                  num_frames=FRAMES, output_type="np", return_dict=False)[0][0]
    video = run(ctx, "ltx2/decode", {}, {"vae": parts["vae"], "latent": up})["video"]
    assert video.frames.array.shape == (FRAMES, 2 * H, 2 * W, 3)
    assert np.abs(video.frames.array.astype(int) - (frames * 255).round()).max() <= 1
    assert video.audio.samples.shape[-1] > 0


def test_clear_errors_name_what_is_wrong(stack, make_ctx, tmp_path):
    from safetensors.torch import save_file

    from workers.runners.base import NodeFailed

    models_dir, name, upsampler = stack
    ctx = make_ctx(models_dir=models_dir)
    with pytest.raises(NodeFailed, match="latent_upscale_models"):
        run(ctx, "load/latent-upscale-model", {"file": "ltx-2.3-spatial-upscaler-x2-1.1.safetensors"})
    (tmp_path / "latent_upscale_models").mkdir()
    save_file({"conv.weight": torch.zeros(2, 2)},
              str(tmp_path / "latent_upscale_models" / "other.safetensors"))
    with pytest.raises(NodeFailed, match="no LTX-2 latent upsampler"):
        run(make_ctx(models_dir=tmp_path), "load/latent-upscale-model",
            {"file": "other.safetensors"})
    parts = run(ctx, "load/checkpoint", {"file": name})
    model = run(ctx, "load/latent-upscale-model", {"file": upsampler})["latent_upscale_model"]
    empty = run(ctx, "ltx2/empty-latent", {"width": W, "height": H, "length": FRAMES,
                                           "fps": FPS})["latent"]
    with pytest.raises(NodeFailed, match="sample it first"):
        run(ctx, "ltx2/upsample-latent", {}, {"latent": empty, "latent_upscale_model": model,
                                              "vae": parts["vae"]})
    _, latent = sampled(ctx, name)
    up = run(ctx, "ltx2/upsample-latent", {}, {"latent": latent, "latent_upscale_model": model,
                                                "vae": parts["vae"]})["latent"]
    positive = run(ctx, "encode/text", {"text": PROMPT}, {"encoder": parts["encoder"]})
    refine = {"model": parts["model"], "positive": positive["conditioning"], "latent": up}
    with pytest.raises(NodeFailed, match="refined over wired sigmas"):
        run(ctx, "ltx2/sample", {"seed": 1, "steps": 2, **GUIDANCE}, refine)
    wired = run(ctx, "sampling/manual-sigmas", {"sigmas": "1.5, 0.5, 0"})
    with pytest.raises(NodeFailed, match="at most 1"):
        run(ctx, "ltx2/sample", {"seed": 1, "steps": 2, **GUIDANCE}, {**refine, **wired})


def test_the_upsampled_clip_refined_from_its_noise_level_is_the_i2v_pipeline_s(stack, make_ctx):
    """The 2.3 templates' second stage: the upsampled clip, its first frame conditioned again
    on the image at the new size, sampled over ManualSigmas from 0.85 (noise mixed in at that
    level, video then sound) equals LTX2ImageToVideoPipeline given the same latents (frame 0
    the image's), audio latents, `noise_scale` and `sigmas`."""
    from diffusers import LTX2ImageToVideoPipeline
    from diffusers.pipelines.ltx2.pipeline_ltx2 import LTX2Pipeline
    from PIL import Image

    from workers.models.ltx2.plugin import components_of, sequence_length

    models_dir, name, upsampler = stack
    ctx = make_ctx(models_dir=models_dir)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (48, 40, 3), dtype=np.uint8))
    parts, latent = sampled(ctx, name)
    model = run(ctx, "load/latent-upscale-model", {"file": upsampler})["latent_upscale_model"]
    up = run(ctx, "ltx2/upsample-latent", {}, {"latent": latent, "latent_upscale_model": model,
                                                "vae": parts["vae"]})["latent"]
    up = run(ctx, "ltx2/image-to-video", {"crf": 0},
             {"vae": parts["vae"], "image": image, "latent": up})["latent"]
    values = [0.85, 0.725, 0.4219, 0.0]
    wired = run(ctx, "sampling/manual-sigmas", {"sigmas": ", ".join(map(str, values))})
    positive = run(ctx, "encode/text", {"text": PROMPT}, {"encoder": parts["encoder"]})
    refined = run(ctx, "ltx2/sample", {"seed": 7, "steps": 40, **GUIDANCE},
                  {"model": parts["model"], "positive": positive["conditioning"], "latent": up,
                   **wired})["latent"]
    video = run(ctx, "ltx2/decode", {}, {"vae": parts["vae"], "latent": refined})["video"]
    components = components_of(parts["model"].transformer)
    vae, audio_vae = components["vae"], components["audio_vae"]
    start = up.samples.clone()
    start[:, :, :1] = up.first
    pipe: Any = LTX2ImageToVideoPipeline(**components)
    pipe.set_progress_bar_config(disable=True)
    out = pipe(image=image, prompt=PROMPT, negative_prompt="",
               generator=torch.Generator().manual_seed(7), sigmas=values[:-1],
               noise_scale=values[0], height=2 * H, width=2 * W, num_frames=FRAMES,
               frame_rate=FPS, image_crf=0,
               latents=LTX2Pipeline._denormalize_latents(
                   start, vae.latents_mean, vae.latents_std, vae.config.scaling_factor),
               audio_latents=LTX2Pipeline._denormalize_audio_latents(
                   up.audio, audio_vae.latents_mean, audio_vae.latents_std),
               max_sequence_length=sequence_length(components), output_type="np",
               spatio_temporal_guidance_blocks=[1])
    frames = (out.frames[0] * 255).round().astype(np.uint8)
    assert video.frames.array.shape == frames.shape == (FRAMES, 2 * H, 2 * W, 3)
    assert np.abs(video.frames.array.astype(int) - frames).max() <= 1
    np.testing.assert_allclose(video.audio.samples, out.audio[0].float().numpy(), atol=1e-4)
