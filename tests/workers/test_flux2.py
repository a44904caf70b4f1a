"""FLUX.2 through the family seam: the tiny Klein stack as studios lay it out, the generic nodes
against diffusers' Flux2KleinPipeline, and runs batching across threads."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.workers.conftest import Recorder
from tests.workers.helpers import noise_image, pixels, png_bytes
from workers.models.catalog import scan
from workers.runners import RUNNERS
from workers.runners.base import NodeFailed

W, H, STEPS = 64, 48, 3
PROMPT = "a lighthouse at dusk"


@pytest.fixture(scope="session")
def flux2_stack(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    from workers.models.flux2.tiny import write_smoke_stack

    models_dir = tmp_path_factory.mktemp("flux2-models")
    return models_dir, write_smoke_stack(models_dir)


@pytest.fixture(scope="session")
def klein_pipeline() -> Any:
    from workers.models.flux2.tiny import smoke_pipeline

    return smoke_pipeline()


def run(ctx: Any, node_type: str, params: dict[str, Any], inputs: dict[str, Any] | None = None):
    return RUNNERS[node_type](ctx, params, inputs or {})


def chain(ctx: Any, names: dict[str, str], *, seed: int = 7, prompt: str = PROMPT,
          guidance: float = 0.0, references: tuple[Any, ...] = (), **sample_params: Any) -> Any:
    """load ×3 (the Qwen3 as FLUX.2's) → encode → [flux2/reference] → empty → sample →
    decode."""
    model = run(ctx, "load/diffusion-model", {"file": names["model"]})["model"]
    vae = run(ctx, "load/vae", {"file": names["vae"]})["vae"]
    encoder = run(ctx, "load/text-encoder", {"file": names["text_encoder"],
                                             "family": "flux2"})["encoder"]
    positive = run(ctx, "encode/text", {"text": prompt}, {"encoder": encoder})["conditioning"]
    if references:
        ports = dict(zip(("image", "image_2", "image_3"), references, strict=False))
        positive = run(ctx, "flux2/reference", {}, {"conditioning": positive, "vae": vae,
                                                    **ports})["conditioning"]
    empty = run(ctx, "latent/empty", {"width": W, "height": H})["latent"]
    params = {"seed": seed, "steps": STEPS, "guidance": guidance, "denoise": 1.0,
              **sample_params}
    latent = run(ctx, "sample", params, {"model": model, "positive": positive,
                                         "latent": empty})["latent"]
    return latent, run(ctx, "vae/decode", {}, {"vae": vae, "latent": latent})["image"]


def reference(pipe: Any, scale: float, seed: int = 7, images: tuple[Any, ...] = ()) -> Any:
    return pipe(prompt=PROMPT, height=H, width=W, num_inference_steps=STEPS, guidance_scale=scale,
                image=list(images) or None,
                generator=torch.Generator("cpu").manual_seed(seed)).images[0]


# Reference images as studios upload them: one square, one that needs its sides floored to 16s.
REF_A, REF_B, REF_C = noise_image(64, 64, seed=1), noise_image(100, 70, seed=2), noise_image(
    80, 96, seed=3)


def test_the_smoke_stack_is_laid_out_as_studios_have_it_and_recognised_from_contents(flux2_stack):
    models_dir, names = flux2_stack
    entries = {(e["folder"], e["name"]): e for e in scan(models_dir)}
    assert entries[("diffusion_models", names["model"])]["role"] == "transformer"
    assert entries[("diffusion_models", names["model"])]["families"] == ["flux2"]  # not FLUX.1
    assert entries[("vae", names["vae"])]["families"] == ["flux2"]
    # Klein's Qwen3 is the same kind of file Z-Image reads: the loader names its family
    assert entries[("text_encoders", names["text_encoder"])]["families"] == ["zimage", "flux2"]
    assert all(name.startswith("smoke-") for name in names.values())
    from safetensors import safe_open

    with safe_open(models_dir / "diffusion_models" / names["model"], "pt") as f:
        stored = f.keys()  # a safe_open is no mapping: keys() is its listing
    assert any(k.startswith("model.diffusion_model.double_blocks.") for k in stored)
    with safe_open(models_dir / "vae" / names["vae"], "pt") as f:
        vae_keys = list(f.keys())  # a safe_open is no mapping
    assert "encoder.down.0.block.0.conv1.weight" in vae_keys  # the original `ae` layout


def test_a_vae_in_diffusers_keys_loads_the_same_weights_as_the_original_layout(
        flux2_stack, cpu_policy, tmp_path):
    from safetensors.torch import save_file

    from workers.models.families import plugin
    from workers.models.flux2.tiny import build_tiny_components

    models_dir, names = flux2_stack
    (tmp_path / "vae").mkdir()
    state = build_tiny_components()["vae"].state_dict()
    save_file({k: v.contiguous() for k, v in state.items()}, tmp_path / "vae" / "diffusers.safetensors")
    stem = names["vae"].removesuffix(".safetensors")
    (tmp_path / "vae" / "diffusers.config.json").write_text(
        (models_dir / "vae" / f"{stem}.config.json").read_text())
    ours = plugin("flux2").load_vae(tmp_path, "diffusers.safetensors", cpu_policy).module
    original = plugin("flux2").load_vae(models_dir, names["vae"], cpu_policy).module
    theirs = original.state_dict()
    assert ours.state_dict().keys() == theirs.keys()
    assert all(torch.equal(v, theirs[k]) for k, v in ours.state_dict().items())


def test_the_original_layout_is_what_diffusers_own_converter_reads():
    from workers.models.flux2 import keys
    from workers.models.flux2.tiny import build_tiny_components

    state = dict(build_tiny_components()["transformer"].state_dict())
    theirs = keys.from_original(keys.to_original(state))
    assert theirs.keys() == state.keys()
    assert all(torch.equal(theirs[k], state[k]) for k in state)


def test_without_cfg_the_generic_nodes_paint_exactly_what_the_klein_pipeline_paints(
        flux2_stack, make_ctx, klein_pipeline):
    models_dir, names = flux2_stack
    _, image = chain(make_ctx(models_dir=models_dir), names, guidance=0.0)
    assert png_bytes(image) == png_bytes(reference(klein_pipeline, 1.0))
    assert png_bytes(image) != png_bytes(reference(klein_pipeline, 1.0, seed=8))


def test_with_cfg_the_generic_nodes_paint_what_the_klein_pipeline_paints(flux2_stack, make_ctx,
                                                                         klein_pipeline):
    """The farm's guidance g is the pipeline's scale − 1 (ComfyUI's cfg − 1). The pipeline runs
    the negative in a forward of its own, the farm in the same forward as the positive: on
    this stack the PNGs are still byte-identical."""
    models_dir, names = flux2_stack
    _, image = chain(make_ctx(models_dir=models_dir), names, guidance=2.0)
    theirs = reference(klein_pipeline, 3.0)
    assert png_bytes(image) == png_bytes(theirs)
    assert abs(pixels(image) - pixels(reference(klein_pipeline, 1.0))).max() > 1  # CFG reaches it


def test_eight_concurrent_runs_share_forwards_and_each_matches_its_solo_run(flux2_stack, make_ctx):
    models_dir, names = flux2_stack
    guidance = {s: (2.0 if s % 2 else 0.0) for s in range(8)}  # CFG and plain runs mixed
    solo = [chain(make_ctx(models_dir=models_dir), names, seed=s, guidance=guidance[s])[0].samples
            for s in range(8)]
    batches: list[int] = []
    results: dict[int, Any] = {}

    def one(seed: int) -> None:
        ctx = make_ctx(Recorder(batches=batches), models_dir=models_dir)
        results[seed] = chain(ctx, names, seed=seed, guidance=guidance[seed])[0].samples

    threads = [threading.Thread(target=one, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(batches) > 1
    for seed in range(8):
        assert torch.allclose(results[seed], solo[seed], atol=1e-4), seed


def test_the_generic_euler_on_the_familys_sigmas_is_the_pipelines_sampler(flux2_stack, make_ctx):
    models_dir, names = flux2_stack
    ctx = make_ctx(models_dir=models_dir)
    own, _ = chain(ctx, names)
    generic, _ = chain(ctx, names, sampler="euler")
    assert torch.allclose(own.samples, generic.samples, atol=1e-5, rtol=0)


def test_the_qwen3_loaded_for_z_image_cannot_condition_a_flux2_model(flux2_stack, make_ctx):
    models_dir, names = flux2_stack
    ctx = make_ctx(models_dir=models_dir)
    encoder = run(ctx, "load/text-encoder", {"file": names["text_encoder"]})["encoder"]
    assert encoder.family == "zimage"  # auto: the first registered family that reads it
    positive = run(ctx, "encode/text", {"text": "x"}, {"encoder": encoder})["conditioning"]
    model = run(ctx, "load/diffusion-model", {"file": names["model"]})["model"]
    empty = run(ctx, "latent/empty", {"width": W, "height": H})["latent"]
    with pytest.raises(NodeFailed, match=r"zimage.*flux2"):
        run(ctx, "sample", {"seed": 0, "steps": 1, "guidance": 0.0, "denoise": 1.0},
            {"model": model, "positive": positive, "latent": empty})


def test_a_family_that_does_not_read_the_file_is_a_clear_error(flux2_stack, make_ctx):
    models_dir, names = flux2_stack
    with pytest.raises(NodeFailed, match=r"smoke-flux2-qwen3.*text_encoders/.*\(sdxl\)"):
        run(make_ctx(models_dir=models_dir), "load/text-encoder",
            {"file": names["text_encoder"], "family": "sdxl"})


def test_a_missing_tokenizer_or_config_names_where_to_put_it(flux2_stack, make_ctx, tmp_path):
    models_dir, names = flux2_stack
    for folder in ("diffusion_models", "text_encoders"):
        (tmp_path / folder).mkdir()
    encoder = names["text_encoder"]
    for folder, name in (("text_encoders", encoder), ("diffusion_models", names["model"])):
        other_weights(models_dir / folder / name, tmp_path / folder / name)  # not the cached
    ctx = make_ctx(models_dir=tmp_path)
    with pytest.raises(NodeFailed, match=r"no tokenizer .*/smoke-flux2-qwen3\.tokenizer/"):
        run(ctx, "load/text-encoder", {"file": encoder, "family": "flux2"})
    with pytest.raises(NodeFailed, match=r"smoke-flux2-klein\.config\.json"):
        run(ctx, "load/diffusion-model", {"file": names["model"]})


def other_weights(source: Path, target: Path) -> None:
    """A copy of the weight file `source` with one weight changed (a model the worker's cache
    has not seen)."""
    from safetensors.torch import load_file, save_file

    state = load_file(str(source))
    first = next(iter(state))
    state[first] = state[first] + 1.0
    save_file(state, str(target))


def test_dev_s_embedded_guidance_is_what_the_flux2_pipeline_paints(flux2_stack, cpu_policy,
                                                                  tmp_path):
    """FLUX.2 dev (its Mistral encoder aside): the transformer file is recognised as FLUX.2 with
    a distilled guidance, and one forward per step with the embedded scale paints what
    Flux2Pipeline paints from the same text embeddings."""
    from diffusers import Flux2Pipeline
    from safetensors.torch import save_file

    from workers.models.families import identify, plugin
    from workers.models.flux2 import engine, keys
    from workers.models.flux2.tiny import TRANSFORMER_CONFIG, build_dev_transformer, build_tiny_components
    from workers.runners.diffusion import noise
    from workers.sampling import SampleJob

    models_dir, names = flux2_stack
    dev = build_dev_transformer()
    (tmp_path / "diffusion_models").mkdir()
    path = tmp_path / "diffusion_models" / "flux2-dev.safetensors"
    save_file(keys.to_original(dev.state_dict()), path)
    path.with_name("flux2-dev.config.json").write_text(json.dumps(
        {"_class_name": "Flux2Transformer2DModel", **TRANSFORMER_CONFIG, "guidance_embeds": True}))
    assert identify(path, "diffusion_models").families == ("flux2",)
    flux2 = plugin("flux2")
    model = flux2.load_diffusion_model(tmp_path, path.name, cpu_policy)
    assert flux2.distilled(model)  # type: ignore[attr-defined]
    vae = flux2.load_vae(models_dir, names["vae"], cpu_policy)

    embeds = torch.randn(1, 512, 3 * 16, generator=torch.Generator().manual_seed(3))
    sigmas, timesteps = flux2.schedule(STEPS, W, H, 1.0)
    start = noise((1, 128, H // 16, W // 16), torch.Generator("cpu").manual_seed(7), "cpu")
    job = SampleJob(latents=start, sigmas=sigmas, timesteps=timesteps,
                    positive=engine.Flux2Prompt(embeds[0]), extra={"guidance": 2.5})
    ours = flux2.decode_latents_batch(vae, [model.batcher.run(job)])[0]
    parts = build_tiny_components()
    pipe: Any = Flux2Pipeline(scheduler=parts["scheduler"], vae=parts["vae"], text_encoder=None,
                         tokenizer=None, transformer=dev)
    pipe.set_progress_bar_config(disable=True)
    theirs = pipe(prompt_embeds=embeds, height=H, width=W, num_inference_steps=STEPS,
                  guidance_scale=2.5, generator=torch.Generator("cpu").manual_seed(7)).images[0]
    assert png_bytes(ours) == png_bytes(theirs)


def test_dev_with_its_mistral3_encoder_paints_exactly_what_the_flux2_pipeline_paints(
        flux2_stack, make_ctx):
    """FLUX.2 dev end to end: its Mistral3 text encoder (a single file with its config and a
    tokenizer whose chat template renders the pipeline's system message) is recognised as
    FLUX.2's, encodes as Flux2Pipeline encodes (hidden states 10, 20, 30), and the generic
    nodes with the distilled guidance paint the pipeline's PNG."""
    from workers.models.families import identify
    from workers.models.flux2.tiny import smoke_dev_pipeline, write_dev_files

    models_dir, names = flux2_stack
    dev = write_dev_files(models_dir)
    encoder_path = models_dir / "text_encoders" / dev["text_encoder_dev"]
    assert identify(encoder_path, "text_encoders").families == ("flux2",)
    ctx = make_ctx(models_dir=models_dir)
    image = chain(ctx, {**names, "model": dev["model_dev"], "text_encoder": dev["text_encoder_dev"]},
                  guidance=2.5)[1]
    assert png_bytes(image) == png_bytes(reference(smoke_dev_pipeline(), 2.5))


@pytest.mark.parametrize("images", [(REF_A,), (REF_A, REF_B), (REF_C, REF_A, REF_B)],
                         ids=["one", "two", "three"])
@pytest.mark.parametrize("guidance", [0.0, 2.0], ids=["plain", "cfg"])
def test_editing_with_reference_images_paints_what_the_klein_pipeline_paints(
        flux2_stack, make_ctx, klein_pipeline, images, guidance):
    models_dir, names = flux2_stack
    edited, image = chain(make_ctx(models_dir=models_dir), names, guidance=guidance,
                          references=images)
    theirs = reference(klein_pipeline, guidance + 1.0, images=images)
    if guidance == 0.0:
        assert png_bytes(image) == png_bytes(theirs)
    else:
        # CFG's two rows share one forward here (batch 2), the pipeline runs them apart: equal
        # bytes on some CPUs, on others (AVX-512) the batch-2 kernels round a level apart
        diff = np.abs(np.asarray(image, np.int16) - np.asarray(theirs, np.int16)).max()
        assert diff <= 1, f"max pixel difference {diff}"
    plain, _ = chain(make_ctx(models_dir=models_dir), names, guidance=guidance)
    # the references reach the model (the tiny VAE's decode flattens most of it in the pixels)
    assert (edited.samples - plain.samples).abs().max() > 1e-3


def test_runs_with_different_references_batch_by_layout_and_each_matches_its_solo_run(
        flux2_stack, make_ctx):
    """Jobs share a forward when their latents and references have the same sizes; others run
    apart in the same iteration (engine.layout). Each result is its solo run's."""
    models_dir, names = flux2_stack
    cases = {0: (), 1: (REF_A,), 2: (REF_A,), 3: (REF_C,), 4: (REF_A, REF_B), 5: (REF_B, REF_A),
             6: (REF_A, REF_B, REF_C), 7: ()}
    solo = {s: chain(make_ctx(models_dir=models_dir), names, seed=s, references=refs)[0].samples
            for s, refs in cases.items()}
    results: dict[int, Any] = {}
    batches: dict[int, list[int]] = {seed: [] for seed in cases}

    def one(seed: int) -> None:
        ctx = make_ctx(Recorder(batches=batches[seed]), models_dir=models_dir)
        results[seed] = chain(ctx, names, seed=seed, references=cases[seed])[0].samples

    threads = [threading.Thread(target=one, args=(s,)) for s in cases]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(max(b) for b in batches.values()) > 1
    for seed in (3, 4, 5, 6):  # a layout of its own: each step's `batch` says it ran apart
        assert set(batches[seed]) == {1}, (seed, batches[seed])
    for seed in cases:
        assert torch.allclose(results[seed], solo[seed], atol=1e-4), seed


def test_a_reference_needs_flux2_s_vae_and_a_usable_size(flux2_stack, smoke_stack, make_ctx):
    from PIL import Image

    models_dir, names = flux2_stack
    ctx = make_ctx(models_dir=models_dir)
    encoder = run(ctx, "load/text-encoder", {"file": names["text_encoder"],
                                             "family": "flux2"})["encoder"]
    positive = run(ctx, "encode/text", {"text": "x"}, {"encoder": encoder})["conditioning"]
    vae = run(ctx, "load/vae", {"file": names["vae"]})["vae"]
    with pytest.raises(NodeFailed, match=r"64"):
        run(ctx, "flux2/reference", {}, {"conditioning": positive, "vae": vae,
                                         "image": Image.new("RGB", (32, 32))})
    zimage_vae = run(make_ctx(), "load/vae", {"file": smoke_stack.names["vae"]})["vae"]
    with pytest.raises(NodeFailed, match=r"'vae'.*flux1"):
        run(ctx, "flux2/reference", {}, {"conditioning": positive, "vae": zimage_vae,
                                         "image": REF_A})
    flux1_latent = run(ctx, "vae/encode", {}, {"vae": zimage_vae, "image": REF_A})["latent"]
    with pytest.raises(NodeFailed, match=r"FLUX\.2 latent \[1, 128, h, w\].*\(1, 16, 8, 8\)"):
        run(ctx, "flux2/reference-latent", {}, {"conditioning": positive, "latent": flux1_latent})


def test_the_flux2_scheduler_node_gives_comfyuis_sigmas_which_are_the_pipelines(make_ctx):
    """ComfyUI's Flux2Scheduler (an even t grid shifted by the empirical mu) is the schedule
    FLUX.2's pipelines use for that size and step count, within float rounding."""
    from workers.models.flux2.engine import schedule

    sigmas = run(make_ctx(), "flux2/scheduler", {"steps": 4, "width": 64, "height": 48})["sigmas"]
    pipeline, _ = schedule(4, 64, 48)
    assert torch.allclose(sigmas.values, pipeline, atol=1e-6, rtol=0)
    wired = run(make_ctx(), "flux2/scheduler", {"steps": 4, "width": 16, "height": 16},
                {"width": 1024, "height": 1024})["sigmas"]
    assert not torch.allclose(wired.values, pipeline, atol=1e-3)  # the size moves the shift
    with pytest.raises(NodeFailed, match=r"sides ≥ 16"):
        run(make_ctx(), "flux2/scheduler", {"steps": 4, "width": 8, "height": 48})


def lora_chain(ctx: Any, names: dict[str, str], loras: tuple[tuple[str, float], ...], *,
               seed: int = 7, guidance: float = 0.0) -> Any:
    """`chain` with the model's LoRAs (load/lora, chained)."""
    model = run(ctx, "load/diffusion-model", {"file": names["model"]})["model"]
    for lora, strength in loras:
        model = run(ctx, "load/lora", {"lora": lora, "strength": strength}, {"model": model})["model"]
    vae = run(ctx, "load/vae", {"file": names["vae"]})["vae"]
    encoder = run(ctx, "load/text-encoder", {"file": names["text_encoder"],
                                             "family": "flux2"})["encoder"]
    positive = run(ctx, "encode/text", {"text": PROMPT}, {"encoder": encoder})["conditioning"]
    empty = run(ctx, "latent/empty", {"width": W, "height": H})["latent"]
    latent = run(ctx, "sample", {"seed": seed, "steps": STEPS, "guidance": guidance,
                                 "denoise": 1.0},
                 {"model": model, "positive": positive, "latent": empty})["latent"]
    return latent, run(ctx, "vae/decode", {}, {"vae": vae, "latent": latent})["image"]


def test_flux2_loras_are_recognised_and_a_render_is_what_the_klein_pipeline_paints(
        flux2_stack, make_ctx):
    from workers.models.flux2.tiny import smoke_pipeline, write_tiny_lora

    models_dir, names = flux2_stack
    lora0, lora1 = (write_tiny_lora(models_dir, f"smoke-flux2-lora{s}.safetensors", seed=s)
                    for s in (0, 1))
    entry = {(e["folder"], e["name"]): e for e in scan(models_dir)}[("loras", lora0)]
    assert (entry["role"], entry["families"]) == ("lora", ["flux2"])
    loras = ((lora0, 1.0), (lora1, 0.6))
    _, ours = lora_chain(make_ctx(models_dir=models_dir), names, loras, guidance=2.0)
    pipe = smoke_pipeline()
    for i, (name, _) in enumerate(loras):
        pipe.load_lora_weights(str(models_dir / "loras" / name), adapter_name=f"a{i}")
    pipe.set_adapters(["a0", "a1"], adapter_weights=[s for _, s in loras])
    theirs = reference(pipe, 3.0)
    assert abs(pixels(ours) - pixels(theirs)).max() <= 1
    _, plain = lora_chain(make_ctx(models_dir=models_dir), names, (), guidance=2.0)
    assert abs(pixels(ours) - pixels(plain)).max() > 1


def test_runs_with_and_without_loras_and_cfg_share_forwards(flux2_stack, make_ctx):
    from workers.models.flux2.tiny import write_tiny_lora

    models_dir, names = flux2_stack
    lora0, lora1 = (write_tiny_lora(models_dir, f"smoke-flux2-lora{s}.safetensors", seed=s)
                    for s in (0, 1))
    runs: list[tuple[tuple[tuple[str, float], ...], float]] = [
        ((), 2.0), (((lora0, 1.0),), 0.0), (((lora1, 0.7),), 2.0),
        (((lora0, 0.5), (lora1, 0.5)), 2.0)]
    solo = [lora_chain(make_ctx(models_dir=models_dir), names, s, seed=i, guidance=g)[0].samples
            for i, (s, g) in enumerate(runs)]
    batches: list[int] = []
    results: dict[int, Any] = {}

    def one(i: int) -> None:
        loras, guidance = runs[i]
        results[i] = lora_chain(make_ctx(Recorder(batches=batches), models_dir=models_dir), names, loras,
                                seed=i, guidance=guidance)[0].samples

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(runs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(batches) > 1
    for i in range(len(runs)):
        assert torch.allclose(results[i], solo[i], atol=1e-4), runs[i]
