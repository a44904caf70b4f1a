"""Wan 2.2 TI2V-5B through the family seam: its 48-channel transformer and the Wan 2.2 VAE
recognised from their files, text to video and image to video with the one transformer
(`wan/ti2v-latent`, ComfyUI's Wan22ImageToVideoLatent) frame for frame (uint8) against
diffusers' WanPipeline / WanImageToVideoPipeline with `expand_timesteps`, and TI2V runs of one
size sharing forwards (a timestep per token, per row) each equal to its solo run."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.workers.helpers import noise_image, wait_for
from tests.workers.test_step_batcher import run_in_threads
from tests.workers.test_wan import levels, run
from workers.models.catalog import scan

W, H, FRAMES, STEPS, GUIDANCE = 64, 32, 9, 3, 5.0  # sides of 32: ÷16, then 2×2 patches
PROMPT = "a paper boat on a puddle"
# The pipelines run CFG's two rows as two forwards, the farm as one: the per-token time
# embedding then multiplies 2·S rows instead of S, which rounds differently (latents within
# ~3e-6 of the pipeline's on this stack), so a frame may land one level off.
ROUNDING = 1


@pytest.fixture(scope="module")
def ti2v_stack(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    from workers.models.wan.tiny import write_smoke_stack

    models_dir = tmp_path_factory.mktemp("wan-ti2v-models")
    return models_dir, write_smoke_stack(models_dir)


def render(ctx: Any, names: dict[str, str], *, start: Any = None, seed: int = 7,
           latent_node: str = "wan/ti2v-latent") -> np.ndarray:
    """TI2V-5B's graph: UMT5, the Wan 2.2 VAE, its clip latent (with `start`: image to video),
    `sample`, the video decode."""
    encoder = run(ctx, "load/text-encoder", {"file": names["text_encoder"],
                                             "family": "wan"})["encoder"]
    vae = run(ctx, "load/vae", {"file": names["vae_22"]})["vae"]
    pos, neg = (run(ctx, "encode/text", {"text": t}, {"encoder": encoder})["conditioning"]
                for t in (PROMPT, ""))
    size = {"width": W, "height": H, "length": FRAMES, "batch": 1}
    inputs = {"vae": vae, **({"start_image": start} if start is not None else {})}
    latent = run(ctx, latent_node, size, inputs if latent_node == "wan/ti2v-latent" else {})
    model = run(ctx, "load/diffusion-model", {"file": names["model_ti2v"]})["model"]
    params = {"seed": seed, "steps": STEPS, "guidance": GUIDANCE, "denoise": 1.0}
    out = run(ctx, "sample", params, {"model": model, "positive": pos, "negative": neg,
                                      "latent": latent["latent"]})["latent"]
    return run(ctx, "vae/decode-video", {}, {"vae": vae, "latent": out})["frames"].array


def reference(start: Any = None, seed: int = 7) -> np.ndarray:
    """The pipeline's frames: WanPipeline(expand_timesteps) for text to video,
    WanImageToVideoPipeline(expand_timesteps) with the start image (WanPipeline's embeddings:
    the I2V pipeline's prompt cleaning wants ftfy)."""
    from workers.models.wan.engine import to_uint8
    from workers.models.wan.tiny import smoke_pipeline

    pipe = smoke_pipeline(ti2v=True, i2v=start is not None)
    pos, neg = smoke_pipeline().encode_prompt(PROMPT, "", max_sequence_length=512)
    extra = {} if start is None else {"image": start}
    out = pipe(prompt_embeds=pos, negative_prompt_embeds=neg, height=H, width=W,
               num_frames=FRAMES, num_inference_steps=STEPS, guidance_scale=GUIDANCE,
               output_type="np", generator=torch.Generator("cpu").manual_seed(seed),
               **extra).frames
    return to_uint8(np.asarray(out[0]))


def test_the_ti2v_transformer_and_the_wan22_vae_are_recognised_from_their_files(ti2v_stack):
    models_dir, names = ti2v_stack
    entries = {(e["folder"], e["name"]): e for e in scan(models_dir)}
    model = entries[("diffusion_models", names["model_ti2v"])]
    assert (model["role"], model["family"], model["variant"]) == ("transformer", "wan", "ti2v")
    vae: dict[str, Any] = entries[("vae", names["vae_22"])]
    assert vae["role"] == "vae" and "wan" in list(vae["families"]), vae


def test_the_wan22_vae_in_its_original_layout_decodes_as_diffusers_layout_one(ti2v_stack,
                                                                               cpu_policy):
    """ComfyUI's `wan2.2_vae.safetensors` (the original `Wan2.2_VAE.pth` keys: `encoder.conv1`,
    `decoder.upsamples.X.upsamples.Y`, `conv1` / `conv2`), under a name that says nothing,
    is recognised from its contents and decodes exactly what the diffusers-layout file does."""
    from safetensors.torch import load_file, save_file

    from workers.models.wan import keys, loading

    models_dir, names = ti2v_stack
    state = load_file(models_dir / "vae" / names["vae_22"])
    original = keys.vae22_to_original(state)
    assert {"encoder.conv1.weight", "decoder.upsamples.0.upsamples.0.residual.2.weight",
            "encoder.downsamples.1.downsamples.1.time_conv.weight", "conv1.weight",
            "conv2.weight", "decoder.head.2.weight"} <= original.keys()
    save_file(original, models_dir / "vae" / "studio-vae.safetensors")
    # the tiny geometry's config beside it (without one: Wan2.2-TI2V-5B-Diffusers' vae config)
    config = models_dir / "vae" / (Path(names["vae_22"]).stem + ".config.json")
    shutil.copy(config, models_dir / "vae" / "studio-vae.config.json")
    entries = {(e["folder"], e["name"]): e for e in scan(models_dir)}
    studio: dict[str, Any] = entries[("vae", "studio-vae.safetensors")]
    assert "wan" in list(studio["families"])
    ours = loading.load_vae(models_dir, "studio-vae.safetensors", cpu_policy)
    theirs = loading.load_vae(models_dir, names["vae_22"], cpu_policy)
    latents = torch.randn(1, 48, 2, H // 16, W // 16, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.equal(ours.module.decode(latents).sample,
                           theirs.module.decode(latents).sample)


def test_text_to_video_is_wan_pipeline_s_with_expand_timesteps(ti2v_stack, make_ctx):
    models_dir, names = ti2v_stack
    ours = render(make_ctx(models_dir=models_dir), names)
    assert ours.shape == (FRAMES, H, W, 3) and ours.dtype == np.uint8
    assert levels(ours, reference()) <= ROUNDING
    # ComfyUI's EmptyHunyuanLatentVideo works as well: the sampler makes the 5B's latents
    plain = render(make_ctx(models_dir=models_dir), names, latent_node="latent/empty-video")
    assert levels(ours, plain) == 0


def test_image_to_video_keeps_the_start_frame_as_wan_image_to_video_pipeline_does(ti2v_stack,
                                                                                  make_ctx):
    models_dir, names = ti2v_stack
    start = noise_image(W, H, seed=3)
    ours = render(make_ctx(models_dir=models_dir), names, start=start)
    assert levels(ours, reference(start)) <= ROUNDING
    assert levels(ours, render(make_ctx(models_dir=models_dir), names)) > 4  # the image counts


def test_clear_errors_for_a_wrong_size_or_vae(ti2v_stack, make_ctx):
    from workers.runners import NodeFailed

    models_dir, names = ti2v_stack
    ctx = make_ctx(models_dir=models_dir)
    vae_21 = run(ctx, "load/vae", {"file": names["vae"]})["vae"]
    size = {"width": W, "height": H, "length": FRAMES, "batch": 1}
    with pytest.raises(NodeFailed, match=r"16 latent channels.*Wan 2\.2 VAE"):
        run(ctx, "wan/ti2v-latent", size, {"vae": vae_21})
    vae = run(ctx, "load/vae", {"file": names["vae_22"]})["vae"]
    with pytest.raises(NodeFailed, match="multiples of 32"):
        run(ctx, "wan/ti2v-latent", {**size, "width": 48}, {"vae": vae})


def test_ti2v_runs_of_one_size_share_forwards_each_equal_to_its_solo_run(ti2v_stack, cpu_policy):
    """Two image-to-video runs (their own start frames, so their own per-token timesteps) and a
    text-to-video one, guided, in one step batcher: they meet in forwards, each result within
    float rounding of its run alone."""
    from workers.models.wan import engine, loading
    from workers.models.wan.engine import ti2v_start
    from workers.runners.diffusion import noise
    from workers.sampling import SampleJob, StepBatcher

    models_dir, names = ti2v_stack
    model = loading.load_diffusion_model(models_dir, names["model_ti2v"], cpu_policy)
    encoder = loading.load_text_encoder(models_dir, [names["text_encoder"]], cpu_policy)
    vae = loading.load_vae(models_dir, names["vae_22"], cpu_policy)
    cond, empty = engine.encode_prompts(encoder, [PROMPT, ""])
    sigmas, timesteps = engine.schedule(STEPS, W, H)
    shape = (1, 48, 3, H // 16, W // 16)

    def keep(seed: int) -> dict[str, Any]:
        samples = torch.zeros(shape)
        samples[:, :, :1] = ti2v_start(vae, noise_image(W, H, seed=seed), W, H)
        mask = torch.ones(1, 1, *shape[2:])
        mask[:, :, 0] = 0
        return {"keep": (samples, mask)}

    extras = [keep(1), keep(2), {}]

    def jobs() -> list[SampleJob]:
        return [SampleJob(noise(shape, torch.Generator("cpu").manual_seed(10 + i), "cpu"),
                          sigmas, timesteps, cond, negative=empty, guidance=GUIDANCE,
                          extra=extra) for i, extra in enumerate(extras)]

    alone = StepBatcher(lambda js: engine.predict(model.transformer, js))
    solo = [alone.run(job) for job in jobs()]
    seen: list[int] = []
    batcher: StepBatcher

    def forward(js: list[SampleJob]) -> list[torch.Tensor]:
        if not seen:
            wait_for(lambda: len(batcher._active) >= len(extras), 30, "all jobs inside")
        seen.append(len(js))
        return engine.predict(model.transformer, js)

    batcher = StepBatcher(forward, gather_seconds=60)
    results, errors = run_in_threads(batcher, jobs())
    assert errors == [None] * len(extras)
    assert max(seen) == len(extras) and len(seen) < STEPS * len(extras)
    for one, together in zip(solo, results, strict=True):
        assert (one - together).abs().max().item() <= 1e-5
    assert (solo[0] - solo[1]).abs().max().item() > 1e-2  # the start frames differ
