"""Krea 2 through the family seam: the tiny stack as studios lay it out (ComfyUI's original
transformer keys, a single-file Qwen3-VL), the generic nodes against diffusers' Krea2Pipeline
(CFG, no CFG, a static shift, a LoRA), runs of different prompts, sizes and guidance batching
across threads as their solo runs, and loads that fail naming what to put where."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.workers.conftest import Recorder
from tests.workers.helpers import noise_image, png_bytes
from workers.models.catalog import scan
from workers.runners import RUNNERS

W, H, STEPS, GUIDANCE = 64, 48, 3, 3.0  # the pipeline's guidance_scale is the farm's g
PROMPT = "a lighthouse at dusk"


@pytest.fixture(scope="module")
def krea_stack(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    from workers.models.krea2.plugin import write_tiny_stack

    models_dir = tmp_path_factory.mktemp("krea2-models")
    return models_dir, write_tiny_stack(models_dir)


@pytest.fixture(scope="module")
def krea_pipeline() -> Any:
    from workers.models.krea2.tiny import smoke_pipeline

    return smoke_pipeline()


def run(ctx: Any, node_type: str, params: dict[str, Any], inputs: dict[str, Any] | None = None) -> Any:
    return RUNNERS[node_type](ctx, params, inputs or {})


def chain(ctx: Any, names: dict[str, str], *, seed: int = 7, prompt: str = PROMPT,
          guidance: float = GUIDANCE, negative: str | None = None, lora: float | None = None,
          width: int = W, height: int = H, **sample_params: Any) -> Any:
    """load ×3 → encode (+ a negative) → empty → sample → decode; (latent, image)."""
    model = run(ctx, "load/diffusion-model", {"file": names["model"]})["model"]
    if lora is not None:
        model = run(ctx, "load/lora", {"lora": names["lora"], "strength": lora},
                    {"model": model})["model"]
    vae = run(ctx, "load/vae", {"file": names["vae"]})["vae"]
    encoder = run(ctx, "load/text-encoder", {"file": names["text_encoder"]})["encoder"]
    empty = run(ctx, "latent/empty", {"width": width, "height": height})["latent"]
    inputs = {"model": model, "latent": empty,
              "positive": run(ctx, "encode/text", {"text": prompt}, {"encoder": encoder})["conditioning"]}
    if negative is not None:
        inputs["negative"] = run(ctx, "encode/text", {"text": negative},
                                 {"encoder": encoder})["conditioning"]
    params = {"seed": seed, "steps": STEPS, "guidance": guidance, "denoise": 1.0, **sample_params}
    latent = run(ctx, "sample", params, inputs)["latent"]
    return latent, run(ctx, "vae/decode", {}, {"vae": vae, "latent": latent})["image"]


def reference(pipe: Any, *, seed: int = 7, prompt: str = PROMPT, guidance: float = GUIDANCE,
              negative: str | None = None) -> Any:
    return pipe(prompt, negative_prompt=negative, guidance_scale=guidance, height=H, width=W,
                num_inference_steps=STEPS,
                generator=torch.Generator("cpu").manual_seed(seed)).images[0]


def max_diff(a: Any, b: Any) -> int:
    pixels = [np.asarray(i.convert("RGB")).astype(int) for i in (a, b)]
    return int(np.abs(pixels[0] - pixels[1]).max())


def test_the_smoke_stack_is_laid_out_as_studios_have_it_and_recognised_from_contents(krea_stack):
    from safetensors import safe_open

    models_dir, names = krea_stack
    entries = {(e["folder"], e["name"]): e for e in scan(models_dir)}
    assert entries[("diffusion_models", names["model"])]["families"] == ["krea2"]
    assert entries[("diffusion_models", names["model"])]["role"] == "transformer"
    # A Qwen3-VL with its vision tower: Qwen-Image 2.1 reads one too (load/text-encoder's
    # `family` picks; "auto" is krea2, registered first).
    assert entries[("text_encoders", names["text_encoder"])]["families"] == ["krea2", "qwenimage21"]
    vae = entries[("vae", names["vae"])]  # Qwen-Image's VAE: read by qwenimage first
    assert vae["role"] == "vae" and "krea2" in vae["families"]  # type: ignore[operator]
    assert entries[("loras", names["lora"])]["families"] == ["krea2"]
    with safe_open(models_dir / "diffusion_models" / names["model"], "pt") as f:
        stored = f.keys()  # a safe_open is no mapping: keys() is its listing
    assert "model.diffusion_model.txtfusion.projector.weight" in stored
    assert "model.diffusion_model.blocks.0.attn.wq.weight" in stored
    with safe_open(models_dir / "text_encoders" / names["text_encoder"], "pt") as f:
        stored = f.keys()
    assert any(k.startswith("model.language_model.layers.") for k in stored)
    assert any(k.startswith("model.visual.") for k in stored)


def test_the_original_layout_is_what_diffusers_own_converter_reads():
    from workers.models.krea2 import keys
    from workers.models.krea2.tiny import build_tiny_components

    state = dict(build_tiny_components()["transformer"].state_dict())
    theirs = keys.from_original(keys.to_original(state))
    assert theirs.keys() == state.keys()
    assert all(torch.equal(theirs[k], v) for k, v in state.items())


def test_the_generic_nodes_paint_exactly_what_krea2_pipeline_paints(krea_stack, make_ctx,
                                                                   krea_pipeline):
    models_dir, names = krea_stack
    latent, image = chain(make_ctx(models_dir=models_dir), names)
    assert png_bytes(image) == png_bytes(reference(krea_pipeline))
    negative = "blurry, low quality"
    other_latent, other = chain(make_ctx(models_dir=models_dir), names, negative=negative)
    assert png_bytes(other) == png_bytes(reference(krea_pipeline, negative=negative))
    plain_latent, plain = chain(make_ctx(models_dir=models_dir), names, guidance=0.0)
    assert png_bytes(plain) == png_bytes(reference(krea_pipeline, guidance=0.0))
    # the negative and the guidance do reach the model
    assert (latent.samples - other_latent.samples).abs().max() > 1e-3
    assert (latent.samples - plain_latent.samples).abs().max() > 1e-3


def test_the_sample_node_s_shift_is_the_distilled_checkpoint_s_fixed_mu(krea_stack, make_ctx):
    """`shift` α is the exponential shift at mu = ln α: e^1.15 paints what the pipeline paints
    for the distilled (turbo) checkpoint (`is_distilled`: mu = 1.15)."""
    import math

    from diffusers import Krea2Pipeline

    from workers.models.krea2.engine import taps
    from workers.models.krea2.tiny import build_tiny_components

    models_dir, names = krea_stack
    _, image = chain(make_ctx(models_dir=models_dir), names, shift=math.exp(1.15), guidance=0.0)
    parts = build_tiny_components()
    pipe: Any = Krea2Pipeline(**parts, text_encoder_select_layers=taps(parts["text_encoder"]),
                         is_distilled=True)
    pipe.set_progress_bar_config(disable=True)
    assert max_diff(image, reference(pipe, guidance=0.0)) <= 1
    _, default = chain(make_ctx(models_dir=models_dir), names, guidance=0.0)
    assert png_bytes(image) != png_bytes(default)


def test_eight_concurrent_runs_of_mixed_prompts_sizes_and_guidance_batch_as_their_solo_runs(
        krea_stack, make_ctx):
    """Every prompt is one fixed-length block under its mask, so runs of a size share a forward
    whatever their prompts, CFG and plain side by side; another size runs its own forward in
    the same step. Each matches its solo run within float rounding."""
    models_dir, names = krea_stack
    runs = [(seed, f"{PROMPT}{' and a boat' * seed}", GUIDANCE if seed % 3 else 0.0,
             (W, H) if seed % 4 else (48, 64)) for seed in range(8)]
    solo = {seed: chain(make_ctx(models_dir=models_dir), names, seed=seed, prompt=prompt,
                        guidance=g, width=size[0], height=size[1])[0].samples
            for seed, prompt, g, size in runs}
    batches: list[int] = []
    results: dict[int, Any] = {}

    def one(seed: int, prompt: str, g: float, size: tuple[int, int]) -> None:
        ctx = make_ctx(Recorder(batches=batches), models_dir=models_dir)
        results[seed] = chain(ctx, names, seed=seed, prompt=prompt, guidance=g, width=size[0],
                              height=size[1])[0].samples

    threads = [threading.Thread(target=one, args=r) for r in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(batches) > 1
    for seed, *_ in runs:
        assert torch.allclose(results[seed], solo[seed], atol=1e-4), seed


def test_the_family_parts_encode_an_image_and_img2img_from_it(krea_stack, cpu_policy):
    """Krea 2 has no img2img pipeline in diffusers: the VAE round trip is the pipeline's decode
    of the encode, and a strength-0.6 run starts from the renoised latents (3 of 4 steps)."""
    from workers.models.families import plugin
    from workers.runners.diffusion import noise
    from workers.sampling import SampleJob

    models_dir, names = krea_stack
    krea = plugin("krea2")
    model = krea.load_diffusion_model(models_dir, names["model"], cpu_policy)
    vae = krea.load_vae(models_dir, names["vae"], cpu_policy)
    encoder = krea.load_text_encoder(models_dir, [names["text_encoder"]], cpu_policy)
    init, generator = noise_image(W, H), torch.Generator("cpu").manual_seed(5)
    sigmas, timesteps = krea.schedule(4, W, H, 0.6)
    assert len(timesteps) == 3
    start = krea.renoise(krea.encode_image(vae, init, generator),
                         noise((1, 16, H // 8, W // 8), generator, "cpu"), sigmas[0])
    positive, negative = krea.encode_prompts(encoder, [PROMPT, ""])
    job = SampleJob(latents=start, sigmas=sigmas, timesteps=timesteps, positive=positive,
                    negative=negative, guidance=1.5)
    out = krea.decode_latents_batch(vae, [model.batcher.run(job)])[0]
    assert out.size == (W, H)


def test_a_lora_render_is_what_the_pipeline_paints_with_the_lora_loaded(krea_stack, make_ctx):
    from workers.models.krea2.tiny import smoke_pipeline

    models_dir, names = krea_stack
    _, ours = chain(make_ctx(models_dir=models_dir), names, lora=0.8)
    pipe = smoke_pipeline()
    pipe.load_lora_weights(str(models_dir / "loras" / names["lora"]), adapter_name="a0")
    pipe.set_adapters(["a0"], adapter_weights=[0.8])
    assert max_diff(ours, reference(pipe)) <= 1
    _, plain = chain(make_ctx(models_dir=models_dir), names)
    assert max_diff(ours, plain) > 4  # the LoRA does change the image


def test_a_single_file_encoder_without_its_tokenizer_names_the_folder_to_put_it_in(make_ctx,
                                                                                  tmp_path):
    from workers.models.krea2.tiny import write_smoke_stack
    from workers.runners.base import NodeFailed

    name = write_smoke_stack(tmp_path, seed=1)["text_encoder"]  # other weights: no cache hit
    stem = tmp_path / "text_encoders" / name.removesuffix(".safetensors")
    bare = tmp_path / "text_encoders" / "qwen3vl_4b.safetensors"
    (tmp_path / "text_encoders" / name).rename(bare)
    ctx = make_ctx(models_dir=tmp_path)
    with pytest.raises(NodeFailed, match=r"no tokenizer.*qwen3vl_4b\.tokenizer/"):
        run(ctx, "load/text-encoder", {"file": bare.name})
    stem.with_name(stem.name + ".tokenizer").rename(bare.with_suffix(".tokenizer"))
    with pytest.raises(NodeFailed, match=r"needs its transformers config.*qwen3vl_4b\.config"):
        run(ctx, "load/text-encoder", {"file": bare.name})
    stem.with_name(stem.name + ".config.json").rename(bare.with_suffix(".config.json"))
    encoder = run(ctx, "load/text-encoder", {"file": bare.name})["encoder"]
    assert encoder.family == "krea2"


def test_a_truncated_transformer_fails_naming_the_file_and_its_folder(krea_stack, make_ctx,
                                                                      tmp_path):
    from safetensors.torch import load_file, save_file

    from workers.runners.base import NodeFailed

    models_dir, names = krea_stack
    (tmp_path / "diffusion_models").mkdir()
    state = load_file(str(models_dir / "diffusion_models" / names["model"]))
    partial = {k: v for k, v in state.items() if ".blocks.1." not in k}
    save_file(partial, tmp_path / "diffusion_models" / "krea2_partial.safetensors")
    with pytest.raises(NodeFailed, match=r"krea2_partial\.safetensors.*diffusion_models/"):
        run(make_ctx(models_dir=tmp_path), "load/diffusion-model",
            {"file": "krea2_partial.safetensors"})


def test_runs_of_two_sizes_in_one_step_run_apart_and_the_worker_counts_why():
    """Issue 36's rule for runs that cannot share a forward: in one step, the two 64×48 jobs
    (other prompts, one with CFG) share a forward, the 48×64 one runs apart — each job's
    `forward_jobs` (its progress `batch`) says so, the heartbeat's counters say why
    (`apart_latent_size`, nothing else) — and each velocity is its solo one within rounding."""
    from workers.counters import counters_report
    from workers.device.policy import DevicePolicy
    from workers.models.krea2 import LATENT, engine
    from workers.models.krea2.tiny import build_tiny_components
    from workers.models.values import TextEncoder
    from workers.sampling import SampleJob
    from workers.sampling.batcher import FORWARD_JOBS

    parts = build_tiny_components(0)
    encoder = TextEncoder("te", "", parts["text_encoder"], parts["tokenizer"],
                          DevicePolicy(profile="cpu").placement("text-encoder"))
    fox, lighthouse, empty = engine.encode_prompts(encoder, ["a fox", PROMPT, ""])
    rng = torch.Generator().manual_seed(0)
    sigmas, timesteps = torch.tensor([1.0, 0.5, 0.0]), torch.tensor([1000.0, 500.0])

    def job(size: tuple[int, int], prompt: Any, guidance: float = 0.0) -> SampleJob:
        return SampleJob(torch.randn(LATENT.shape(*size), generator=rng), sigmas, timesteps,
                         prompt, negative=empty if guidance else None, guidance=guidance)

    jobs = [job((64, 48), fox), job((48, 64), lighthouse), job((64, 48), lighthouse, GUIDANCE)]
    before = counters_report()
    together = engine.predict(parts["transformer"], jobs)
    after = counters_report()
    assert [j.extra[FORWARD_JOBS] for j in jobs] == [2, 1, 2]
    grew = {k: after[k] - before.get(k, 0) for k in after
            if k.startswith("apart_") and after[k] != before.get(k, 0)}
    assert grew == {"apart_latent_size": 1}
    for one, velocity in zip(jobs, together, strict=True):
        assert (engine.predict(parts["transformer"], [one])[0] - velocity).abs().max() < 1e-5
