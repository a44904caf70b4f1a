"""Qwen-Image 2.1 through the family seam: the tiny stack recognised from its contents, the
generic nodes against diffusers' QwenImage21Pipeline (text-to-image, CFG, condition images, a
LoRA), runs batching in one forward, and a text encoder without its tokenizer."""

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

W, H, STEPS = 64, 96, 2
PROMPT = "a lighthouse at dusk"


@pytest.fixture(scope="session")
def q21_stack(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    from workers.models.qwenimage21.plugin import write_tiny_stack

    models_dir = tmp_path_factory.mktemp("qwen21-models")
    return models_dir, write_tiny_stack(models_dir)


@pytest.fixture(scope="session")
def q21_pipeline() -> Any:
    from workers.models.qwenimage21.tiny import smoke_pipeline

    return smoke_pipeline()


def run(ctx: Any, node_type: str, params: dict[str, Any], inputs: dict[str, Any] | None = None) -> Any:
    return RUNNERS[node_type](ctx, params, inputs or {})


def chain(ctx: Any, names: dict[str, str], *, seed: int = 7, prompt: str = PROMPT,
          guidance: float = 0.0, negative: str | None = None, lora: float | None = None) -> Any:
    """load ×3 (+ load/lora) → encode (+ a negative) → empty → sample → decode; (latent, image)."""
    model = run(ctx, "load/diffusion-model", {"file": names["model"]})["model"]
    if lora is not None:
        model = run(ctx, "load/lora", {"lora": names["lora"], "strength": lora},
                    {"model": model})["model"]
    vae = run(ctx, "load/vae", {"file": names["vae"]})["vae"]
    encoder = run(ctx, "load/text-encoder", {"file": names["text_encoder"],
                                                "family": "qwenimage21"})["encoder"]
    inputs = {"model": model, "latent": run(ctx, "latent/empty", {"width": W, "height": H})["latent"],
              "positive": run(ctx, "encode/text", {"text": prompt}, {"encoder": encoder})["conditioning"]}
    if negative is not None:
        inputs["negative"] = run(ctx, "encode/text", {"text": negative},
                                 {"encoder": encoder})["conditioning"]
    params = {"seed": seed, "steps": STEPS, "guidance": guidance, "denoise": 1.0}
    latent = run(ctx, "sample", params, inputs)["latent"]
    return latent, run(ctx, "vae/decode", {}, {"vae": vae, "latent": latent})["image"]


def reference(pipe: Any, *, seed: int = 7, prompt: str = PROMPT, **kwargs: Any) -> Any:
    """QwenImage21Pipeline's image (no prefix KV cache), its RGBA decode's RGB."""
    return pipe(prompt, height=H, width=W, num_inference_steps=STEPS, use_kv_cache=False,
                generator=torch.Generator("cpu").manual_seed(seed), **kwargs).images[0].convert("RGB")


def max_diff(a: Any, b: Any) -> int:
    pixels = [np.asarray(i.convert("RGB")).astype(int) for i in (a, b)]
    return int(np.abs(pixels[0] - pixels[1]).max())


def test_the_tiny_stack_is_recognised_from_its_contents(q21_stack):
    models_dir, names = q21_stack
    entries = {(e["folder"], e["name"]): e for e in scan(models_dir)}
    for folder, role, key in (("diffusion_models", "transformer", "model"), ("vae", "vae", "vae"),
                              ("text_encoders", "text_encoder", "text_encoder"),
                              ("loras", "lora", "lora")):
        entry = entries[(folder, names[key])]
        # Krea 2 reads the same Qwen3-VL (registered first: load/text-encoder's `family` picks)
        owners = ["krea2", "qwenimage21"] if key == "text_encoder" else ["qwenimage21"]
        assert (entry["role"], entry["families"]) == (role, owners), entry


def test_the_generic_nodes_paint_exactly_what_the_2_1_pipeline_paints(q21_stack, make_ctx,
                                                                      q21_pipeline):
    models_dir, names = q21_stack
    latent, image = chain(make_ctx(models_dir=models_dir), names)
    assert tuple(latent.samples.shape) == (1, 64, H // 16, W // 16)
    assert png_bytes(image) == png_bytes(reference(q21_pipeline))
    # true CFG: the farm's g is the pipeline's true_cfg_scale − 1
    _, guided = chain(make_ctx(models_dir=models_dir), names, guidance=2.0, negative="blurry")
    theirs = reference(q21_pipeline, negative_prompt="blurry", true_cfg_scale=3.0)
    assert png_bytes(guided) == png_bytes(theirs)
    assert png_bytes(guided) != png_bytes(image)


def test_a_lora_render_is_what_the_pipeline_paints_with_the_lora_loaded(q21_stack, make_ctx):
    from workers.models.qwenimage21.tiny import smoke_pipeline

    models_dir, names = q21_stack
    _, ours = chain(make_ctx(models_dir=models_dir), names, lora=0.8)
    pipe = smoke_pipeline()
    pipe.load_lora_weights(str(models_dir / "loras" / names["lora"]), adapter_name="a0")
    pipe.set_adapters(["a0"], adapter_weights=[0.8])
    assert max_diff(ours, reference(pipe)) <= 1
    _, plain = chain(make_ctx(models_dir=models_dir), names)
    assert max_diff(ours, plain) > 4  # the LoRA does change the image


def test_runs_of_one_prompt_length_share_a_forward_each_as_its_solo_run(q21_stack, make_ctx):
    models_dir, names = q21_stack
    runs = [(seed, PROMPT if seed % 2 else PROMPT.upper()) for seed in range(4)]  # one length
    solo = {seed: chain(make_ctx(models_dir=models_dir), names, seed=seed, prompt=prompt)[0].samples
            for seed, prompt in runs}
    batches: list[int] = []
    results: dict[int, Any] = {}

    def one(seed: int, prompt: str) -> None:
        ctx = make_ctx(Recorder(batches=batches), models_dir=models_dir)
        results[seed] = chain(ctx, names, seed=seed, prompt=prompt)[0].samples

    threads = [threading.Thread(target=one, args=r) for r in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(batches) > 1
    for seed, _ in runs:
        assert torch.allclose(results[seed], solo[seed], atol=1e-5), seed


def test_condition_images_reproduce_the_pipeline_s_image_mode(q21_stack, cpu_policy, q21_pipeline):
    from workers.models.families import plugin
    from workers.models.qwenimage21 import engine
    from workers.runners.diffusion import noise
    from workers.sampling import SampleJob

    models_dir, names = q21_stack
    q21 = plugin("qwenimage21")
    model = q21.load_diffusion_model(models_dir, names["model"], cpu_policy)
    vae = q21.load_vae(models_dir, names["vae"], cpu_policy)
    encoder = q21.load_text_encoder(models_dir, [names["text_encoder"]], cpu_policy)
    images = [noise_image(64, 96), noise_image(96, 64)]
    prompt = engine.encode_with_images(encoder, vae, "make it blue", images, resolution=96)
    assert [tuple(r.shape) for r in prompt.references] == [(1, 64, 8, 4), (1, 64, 4, 8)]
    w, h = engine.dimensions(96 * 96, 96, 64)  # the last image's aspect ratio
    sigmas, timesteps = q21.schedule(STEPS, w, h, 1.0)
    start = noise((1, 64, h // 16, w // 16), torch.Generator("cpu").manual_seed(3), "cpu")
    job = SampleJob(latents=start, sigmas=sigmas, timesteps=timesteps, positive=prompt,
                    negative=None, guidance=0.0)
    ours = q21.decode_latents_batch(vae, [model.batcher.run(job)])[0]
    theirs = q21_pipeline("make it blue", image=images, output_resolution=96,
                          num_inference_steps=STEPS, use_kv_cache=False,
                          generator=torch.Generator("cpu").manual_seed(3)).images[0]
    assert ours.size == theirs.size == (w, h)
    assert np.array_equal(np.asarray(ours), np.asarray(theirs.convert("RGB")))


def test_a_single_file_encoder_without_its_tokenizer_names_the_folder(make_ctx, tmp_path):
    from workers.models.qwenimage21.tiny import write_smoke_stack
    from workers.runners.base import NodeFailed

    name = write_smoke_stack(tmp_path, seed=1)["text_encoder"]
    bare = tmp_path / "text_encoders" / "qwen3vl_8b.safetensors"
    (tmp_path / "text_encoders" / name).rename(bare)
    with pytest.raises(NodeFailed, match=r"no tokenizer.*qwen3vl_8b\.tokenizer/"):
        run(make_ctx(models_dir=tmp_path), "load/text-encoder", {"file": bare.name})


def test_runs_of_other_prompt_lengths_or_sizes_run_apart_and_the_worker_counts_why():
    """Issue 36's rule for runs that cannot share a forward: in one step, two 64×96 jobs whose
    prompts have one token count share a forward; a shorter prompt and another size each run
    apart — each job's `forward_jobs` (its progress `batch`) says so, the heartbeat's counters
    say why (`apart_prompt_tokens`, `apart_latent_size`) — and each velocity is its solo one."""
    from workers.counters import counters_report
    from workers.device.policy import DevicePolicy
    from workers.models.qwenimage21 import LATENT, engine
    from workers.models.qwenimage21.tiny import build_tiny_components
    from workers.models.values import TextEncoder
    from workers.sampling import SampleJob
    from workers.sampling.batcher import FORWARD_JOBS

    parts = build_tiny_components(0)
    processor = parts["processor"]
    encoder = TextEncoder("te", "", parts["text_encoder"],
                          engine.Tokenizers(processor.tokenizer, processor, Path(".")),
                          DevicePolicy(profile="cpu").placement("text-encoder"))
    lower, upper, fox = engine.encode_prompts(encoder, [PROMPT, PROMPT.upper(), "a fox"])
    assert lower.embeds.shape[0] == upper.embeds.shape[0] != fox.embeds.shape[0]
    rng = torch.Generator().manual_seed(0)
    sigmas, timesteps = torch.tensor([1.0, 0.5, 0.0]), torch.tensor([1000.0, 500.0])

    def job(size: tuple[int, int], prompt: Any) -> SampleJob:
        return SampleJob(torch.randn(LATENT.shape(*size), generator=rng), sigmas, timesteps,
                         prompt)

    jobs = [job((W, H), lower), job((W, H), fox), job((H, W), lower), job((W, H), upper)]
    before = counters_report()
    together = engine.predict(parts["transformer"], jobs)
    after = counters_report()
    assert [j.extra[FORWARD_JOBS] for j in jobs] == [2, 1, 1, 2]
    grew = {k: after[k] - before.get(k, 0) for k in after
            if k.startswith("apart_") and after[k] != before.get(k, 0)}
    assert grew == {"apart_latent_size": 1, "apart_prompt_tokens": 1}
    for one, velocity in zip(jobs, together, strict=True):
        assert (engine.predict(parts["transformer"], [one])[0] - velocity).abs().max() < 1e-5
