"""Qwen-Image through the family seam: the tiny stack as studios lay it out, the generic nodes
against diffusers' QwenImagePipeline (true CFG, its norm rescale), runs of different prompts and
guidance batching across threads, LoRAs, and loads that fail naming what to put where."""

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

W, H, STEPS, GUIDANCE = 64, 48, 3, 3.0  # the pipeline's true_cfg_scale: GUIDANCE + 1
PROMPT = "a lighthouse at dusk"


@pytest.fixture(scope="session")
def qwen_stack(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    from workers.models.qwenimage.plugin import write_tiny_stack

    models_dir = tmp_path_factory.mktemp("qwen-models")
    return models_dir, write_tiny_stack(models_dir)


@pytest.fixture(scope="session")
def qwen_pipeline() -> Any:
    from workers.models.qwenimage.tiny import smoke_pipeline

    return smoke_pipeline()


def run(ctx: Any, node_type: str, params: dict[str, Any], inputs: dict[str, Any] | None = None) -> Any:
    return RUNNERS[node_type](ctx, params, inputs or {})


def chain(ctx: Any, names: dict[str, str], *, seed: int = 7, prompt: str = PROMPT,
          guidance: float = GUIDANCE, negative: str | None = None, lora: float | None = None,
          **sample_params: Any) -> Any:
    """load ×3 → encode (+ a negative) → empty → sample → decode; (latent, image)."""
    model = run(ctx, "load/diffusion-model", {"file": names["model"]})["model"]
    if lora is not None:
        model = run(ctx, "load/lora", {"lora": names["lora"], "strength": lora},
                    {"model": model})["model"]
    vae = run(ctx, "load/vae", {"file": names["vae"]})["vae"]
    encoder = run(ctx, "load/text-encoder", {"file": names["text_encoder"]})["encoder"]
    inputs = {"model": model, "latent": run(ctx, "latent/empty", {"width": W, "height": H})["latent"],
              "positive": run(ctx, "encode/text", {"text": prompt}, {"encoder": encoder})["conditioning"]}
    if negative is not None:
        inputs["negative"] = run(ctx, "encode/text", {"text": negative},
                                 {"encoder": encoder})["conditioning"]
    params = {"seed": seed, "steps": STEPS, "guidance": guidance, "denoise": 1.0, **sample_params}
    latent = run(ctx, "sample", params, inputs)["latent"]
    return latent, run(ctx, "vae/decode", {}, {"vae": vae, "latent": latent})["image"]


def reference(pipe: Any, *, seed: int = 7, prompt: str = PROMPT, guidance: float = GUIDANCE,
              negative: str = "") -> Any:
    """QwenImagePipeline's image at the farm's guidance g (true_cfg_scale g + 1; the farm's
    unwired negative is the empty prompt)."""
    return pipe(prompt, negative_prompt=negative, true_cfg_scale=guidance + 1.0, height=H,
                width=W, num_inference_steps=STEPS,
                generator=torch.Generator("cpu").manual_seed(seed)).images[0]


def max_diff(a: Any, b: Any) -> int:
    pixels = [np.asarray(i.convert("RGB")).astype(int) for i in (a, b)]
    return int(np.abs(pixels[0] - pixels[1]).max())


def test_the_smoke_stack_is_laid_out_as_studios_have_it_and_recognised_from_contents(qwen_stack):
    from safetensors import safe_open

    models_dir, names = qwen_stack
    entries = {(e["folder"], e["name"]): e for e in scan(models_dir)}
    for folder, role, key in (("diffusion_models", "transformer", "model"), ("vae", "vae", "vae"),
                              ("text_encoders", "text_encoder", "text_encoder")):
        entry = entries[(folder, names[key])]
        # Qwen-Image's VAE is a Wan 2.1 VAE: Wan and Krea 2 read it too (listed after it)
        families = ["qwenimage", "wan", "krea2"] if role == "vae" else ["qwenimage"]
        assert (entry["role"], entry["families"]) == (role, families), entry
    assert entries[("loras", names["lora"])]["family"] == "qwenimage"
    assert all(name.startswith("smoke-") for name in names.values())
    with safe_open(models_dir / "diffusion_models" / names["model"], "pt") as f:
        stored = f.keys()  # a safe_open is no mapping: keys() is its listing
    assert all(k.startswith("model.diffusion_model.transformer_blocks.") or
               not k.startswith("model.diffusion_model.transformer") for k in stored)
    with safe_open(models_dir / "text_encoders" / names["text_encoder"], "pt") as f:
        stored = f.keys()
    assert any(k.startswith("model.layers.") for k in stored)  # the checkpoint's layout
    assert any(k.startswith("visual.") for k in stored)  # with its vision tower
    with safe_open(models_dir / "vae" / names["vae"], "pt") as f:
        stored = f.keys()
    assert "decoder.conv1.weight" in stored and "decoder.upsamples.3.resample.1.weight" in stored


def test_the_vae_s_original_layout_is_what_diffusers_own_converter_reads():
    from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers

    from workers.models.qwenimage import keys
    from workers.models.qwenimage.tiny import build_tiny_components

    state = dict(build_tiny_components()["vae"].state_dict())
    theirs = convert_wan_vae_to_diffusers(keys.to_original(state))
    assert theirs.keys() == state.keys()
    assert all(torch.equal(theirs[k], v) for k, v in state.items())


def test_the_generic_nodes_paint_exactly_what_qwen_image_pipeline_paints(qwen_stack, make_ctx,
                                                                         qwen_pipeline):
    models_dir, names = qwen_stack
    _, image = chain(make_ctx(models_dir=models_dir), names)
    assert png_bytes(image) == png_bytes(reference(qwen_pipeline))
    _, other = chain(make_ctx(models_dir=models_dir), names, guidance=1.0)
    assert png_bytes(image) != png_bytes(other)  # the guidance does reach the model


def test_a_wired_negative_and_no_guidance_are_the_pipeline_s_too(qwen_stack, make_ctx,
                                                                 qwen_pipeline):
    """A negative longer than the prompt pads the prompt's row under the mask in the shared
    forward (the pipeline runs two forwards): the same image within one level of rounding."""
    models_dir, names = qwen_stack
    negative = "blurry, low quality"
    _, image = chain(make_ctx(models_dir=models_dir), names, negative=negative)
    theirs = reference(qwen_pipeline, negative=negative)
    assert max_diff(image, theirs) <= 1
    assert max_diff(image, reference(qwen_pipeline)) > 1  # the negative does reach the model
    _, plain = chain(make_ctx(models_dir=models_dir), names, guidance=0.0)
    theirs = qwen_pipeline(PROMPT, height=H, width=W, num_inference_steps=STEPS,
                           generator=torch.Generator("cpu").manual_seed(7)).images[0]
    assert png_bytes(plain) == png_bytes(theirs)  # true_cfg_scale 1: one forward per step


def test_the_sample_node_s_shift_is_the_scheduler_s_static_shift(qwen_stack, make_ctx):
    """With `shift` α the generic nodes paint what the pipeline paints on a scheduler of static
    shift α (ComfyUI's ModelSamplingAuraFlow: no dynamic shift, no terminal stretch)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    from workers.models.qwenimage.tiny import smoke_pipeline

    models_dir, names = qwen_stack
    _, image = chain(make_ctx(models_dir=models_dir), names, shift=3.1)
    pipe = smoke_pipeline()
    pipe.scheduler = FlowMatchEulerDiscreteScheduler.from_config(
        pipe.scheduler.config, shift=3.1, use_dynamic_shifting=False, shift_terminal=None)
    assert png_bytes(image) == png_bytes(reference(pipe))
    _, default = chain(make_ctx(models_dir=models_dir), names)
    assert png_bytes(image) != png_bytes(default)


def test_the_family_parts_reproduce_the_img2img_pipeline(qwen_stack, cpu_policy):
    from diffusers import QwenImageImg2ImgPipeline

    from workers.models.families import plugin
    from workers.models.qwenimage.tiny import build_tiny_components
    from workers.runners.diffusion import noise
    from workers.sampling import SampleJob

    models_dir, names = qwen_stack
    qwen = plugin("qwenimage")
    model = qwen.load_diffusion_model(models_dir, names["model"], cpu_policy)
    vae = qwen.load_vae(models_dir, names["vae"], cpu_policy)
    encoder = qwen.load_text_encoder(models_dir, [names["text_encoder"]], cpu_policy)
    init, generator = noise_image(W, H), torch.Generator("cpu").manual_seed(5)
    sigmas, timesteps = qwen.schedule(4, W, H, 0.6)
    start = qwen.renoise(qwen.encode_image(vae, init, generator),
                         noise((1, 16, H // 8, W // 8), generator, "cpu"), sigmas[0])
    positive, negative = qwen.encode_prompts(encoder, [PROMPT, ""])
    job = SampleJob(latents=start, sigmas=sigmas, timesteps=timesteps, positive=positive,
                    negative=negative, guidance=1.5)
    ours = qwen.decode_latents_batch(vae, [model.batcher.run(job)])[0]
    pipe: Any = QwenImageImg2ImgPipeline(**build_tiny_components())
    pipe.set_progress_bar_config(disable=True)
    theirs = pipe(PROMPT, image=init, negative_prompt="", true_cfg_scale=2.5, height=H, width=W,
                  strength=0.6, num_inference_steps=4,
                  generator=torch.Generator("cpu").manual_seed(5)).images[0]
    assert len(timesteps) == 3  # strength 0.6 of 4 steps: the pipeline skips int(1.6) = 1
    assert png_bytes(ours) == png_bytes(theirs)


def test_eight_concurrent_runs_of_mixed_prompts_and_guidance_share_forwards_as_their_solo_runs(
        qwen_stack, make_ctx):
    """Prompts of other lengths share a forward (zero-padded under the attention mask), CFG and
    plain runs side by side; each matches its solo run within float rounding."""
    models_dir, names = qwen_stack
    runs = [(seed, f"{PROMPT}{' and a boat' * seed}", GUIDANCE if seed % 3 else 0.0)
            for seed in range(8)]
    solo = {seed: chain(make_ctx(models_dir=models_dir), names, seed=seed, prompt=prompt,
                        guidance=g)[0].samples for seed, prompt, g in runs}
    batches: list[int] = []
    results: dict[int, Any] = {}

    def one(seed: int, prompt: str, g: float) -> None:
        ctx = make_ctx(Recorder(batches=batches), models_dir=models_dir)
        results[seed] = chain(ctx, names, seed=seed, prompt=prompt, guidance=g)[0].samples

    threads = [threading.Thread(target=one, args=r) for r in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(batches) > 1
    for seed, _, _ in runs:
        assert torch.allclose(results[seed], solo[seed], atol=1e-4), seed


def test_the_generic_euler_on_the_family_s_sigmas_is_the_pipeline_s_sampler(qwen_stack, make_ctx):
    models_dir, names = qwen_stack
    ctx = make_ctx(models_dir=models_dir)
    own, _ = chain(ctx, names)
    generic, _ = chain(ctx, names, sampler="euler")
    assert torch.allclose(own.samples, generic.samples, atol=1e-5, rtol=0)
    karras, _ = chain(ctx, names, sampler="dpmpp_2m", scheduler="karras")
    assert torch.isfinite(karras.samples).all()
    assert (karras.samples - own.samples).abs().max() > 1e-2


def test_a_lora_render_is_what_the_pipeline_paints_with_the_lora_loaded(qwen_stack, make_ctx):
    from workers.models.qwenimage.tiny import smoke_pipeline

    models_dir, names = qwen_stack
    _, ours = chain(make_ctx(models_dir=models_dir), names, lora=0.8)
    pipe = smoke_pipeline()
    pipe.load_lora_weights(str(models_dir / "loras" / names["lora"]), adapter_name="a0")
    pipe.set_adapters(["a0"], adapter_weights=[0.8])
    assert max_diff(ours, reference(pipe)) <= 1
    _, plain = chain(make_ctx(models_dir=models_dir), names)
    assert max_diff(ours, plain) > 4  # the LoRA does change the image


def test_a_single_file_encoder_without_its_tokenizer_names_the_folder_to_put_it_in(make_ctx,
                                                                                  tmp_path):
    from workers.models.qwenimage.tiny import write_smoke_stack
    from workers.runners.base import NodeFailed

    name = write_smoke_stack(tmp_path, seed=1)["text_encoder"]  # other weights: no cache hit
    stem = tmp_path / "text_encoders" / name.removesuffix(".safetensors")
    bare = tmp_path / "text_encoders" / "qwen_2.5_vl_7b.safetensors"
    (tmp_path / "text_encoders" / name).rename(bare)
    ctx = make_ctx(models_dir=tmp_path)
    with pytest.raises(NodeFailed, match=r"no tokenizer.*qwen_2\.5_vl_7b\.tokenizer/"):
        run(ctx, "load/text-encoder", {"file": bare.name})
    stem.with_name(stem.name + ".tokenizer").rename(bare.with_suffix(".tokenizer"))
    with pytest.raises(NodeFailed, match=r"needs its transformers config.*qwen_2\.5_vl_7b\.config"):
        run(ctx, "load/text-encoder", {"file": bare.name})
    stem.with_name(stem.name + ".config.json").rename(bare.with_suffix(".config.json"))
    encoder = run(ctx, "load/text-encoder", {"file": bare.name})["encoder"]
    assert encoder.family == "qwenimage"


def test_a_truncated_transformer_fails_naming_the_file_and_its_folder(qwen_stack, make_ctx,
                                                                      tmp_path):
    from safetensors.torch import load_file, save_file

    from workers.runners.base import NodeFailed

    models_dir, names = qwen_stack
    (tmp_path / "diffusion_models").mkdir()
    state = load_file(str(models_dir / "diffusion_models" / names["model"]))
    partial = {k: v for k, v in state.items() if "transformer_blocks.1." not in k}
    save_file(partial, tmp_path / "diffusion_models" / "qwen_image_partial.safetensors")
    with pytest.raises(NodeFailed, match=r"qwen_image_partial\.safetensors.*diffusion_models/"):
        run(make_ctx(models_dir=tmp_path), "load/diffusion-model",
            {"file": "qwen_image_partial.safetensors"})
