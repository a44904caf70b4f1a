"""LoRA (workers/models/lora.py, the `load/lora` node) on the tiny FLUX.1 stack: what diffusers'
pipeline paints with the same LoRA loaded, runs with different LoRA sets sharing forwards over
one base model, and the LoRA file's content (not its name) deciding the image."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.workers.conftest import Recorder
from tests.workers.helpers import pixels
from workers.counters import counters_report
from workers.models.catalog import file_sha256, scan
from workers.runners import RUNNERS, NodeFailed

W, H, STEPS, GUIDANCE = 64, 48, 3, 2.5
PROMPT = "a lighthouse at dusk"


@pytest.fixture(scope="module")
def lora_stack(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    from workers.models.flux1.tiny import write_smoke_stack, write_tiny_lora

    models_dir = tmp_path_factory.mktemp("lora-models")
    names = write_smoke_stack(models_dir)
    for seed in range(4):
        names[f"lora{seed}"] = write_tiny_lora(models_dir, f"style-{seed}.safetensors", seed=seed)
    return models_dir, names


def run(ctx: Any, node_type: str, params: dict[str, Any], inputs: dict[str, Any] | None = None):
    return RUNNERS[node_type](ctx, params, inputs or {})


def render(ctx: Any, names: dict[str, str], loras: tuple[tuple[str, float], ...] = (),
           seed: int = 7) -> tuple[Any, Any]:
    """load → (load/lora)* → encode → empty → sample → decode: (latents, image)."""
    model = run(ctx, "load/diffusion-model", {"file": names["model"]})["model"]
    for name, strength in loras:
        model = run(ctx, "load/lora", {"lora": name, "strength": strength},
                    {"model": model})["model"]
    vae = run(ctx, "load/vae", {"file": names["vae"]})["vae"]
    encoder = run(ctx, "load/text-encoder", {"file": names["text_encoder"],
                                             "file_2": names["text_encoder_2"]})["encoder"]
    positive = run(ctx, "encode/text", {"text": PROMPT}, {"encoder": encoder})["conditioning"]
    empty = run(ctx, "latent/empty", {"width": W, "height": H})["latent"]
    params = {"seed": seed, "steps": STEPS, "guidance": GUIDANCE, "denoise": 1.0}
    latent = run(ctx, "sample", params, {"model": model, "positive": positive,
                                         "latent": empty})["latent"]
    return latent.samples, run(ctx, "vae/decode", {}, {"vae": vae, "latent": latent})["image"]


def reference(models_dir: Path, loras: tuple[tuple[str, float], ...], seed: int = 7) -> Any:
    """diffusers' FluxPipeline with the same LoRA files loaded (load_lora_weights,
    set_adapters at the same strengths)."""
    from workers.models.flux1.tiny import smoke_pipeline

    pipe = smoke_pipeline()
    for i, (name, _) in enumerate(loras):
        pipe.load_lora_weights(str(models_dir / "loras" / name), adapter_name=f"a{i}")
    if loras:
        pipe.set_adapters([f"a{i}" for i in range(len(loras))],
                          adapter_weights=[s for _, s in loras])
    return pipe(PROMPT, height=H, width=W, num_inference_steps=STEPS, guidance_scale=GUIDANCE,
                generator=torch.Generator("cpu").manual_seed(seed)).images[0]


def max_diff(a: Any, b: Any) -> int:
    return int(np.abs(pixels(a) - pixels(b)).max())


def test_lora_files_are_recognised_from_their_keys_as_flux_loras(lora_stack):
    models_dir, names = lora_stack
    entries = {(e["folder"], e["name"]): e for e in scan(models_dir)}
    entry = entries[("loras", names["lora0"])]
    assert (entry["role"], entry["family"]) == ("lora", "flux1")


@pytest.mark.parametrize("loras", [(("style-0.safetensors", 0.8),),
                                   (("style-1.safetensors", 1.0), ("style-2.safetensors", -0.6))],
                         ids=["one", "stack-of-two"])
def test_a_lora_render_is_what_flux_pipeline_paints_with_the_lora_loaded(lora_stack, make_ctx,
                                                                         loras):
    models_dir, names = lora_stack
    ctx = make_ctx(models_dir=models_dir)
    _, ours = render(ctx, names, loras)
    assert max_diff(ours, reference(models_dir, loras)) <= 1
    _, plain = render(make_ctx(models_dir=models_dir), names)
    assert max_diff(ours, plain) > 8  # the LoRA does change the image
    assert ctx.lineage["loras"] == {  # the lineage names each LoRA's content and strength
        f"loras/{name}": {"sha256": file_sha256(models_dir / "loras" / name), "strength": strength}
        for name, strength in loras}


def test_eight_runs_with_eight_lora_sets_share_forwards_over_one_base_model(lora_stack, make_ctx):
    models_dir, names = lora_stack
    sets: list[tuple[tuple[str, float], ...]] = [
        (), ((names["lora0"], 1.0),), ((names["lora0"], 0.5),), ((names["lora1"], 1.0),),
        ((names["lora2"], 0.7),), ((names["lora3"], 1.2),),
        ((names["lora1"], 0.8), (names["lora2"], 0.6)), ()]
    base = run(make_ctx(models_dir=models_dir), "load/diffusion-model",
               {"file": names["model"]})["model"]
    before = {k: v.clone() for k, v in base.transformer.state_dict().items()}
    loads = counters_report().get("denoiser_loads", 0)
    solo = [render(make_ctx(models_dir=models_dir), names, s, seed=i)[0]
            for i, s in enumerate(sets)]
    batches: list[int] = []
    results: dict[int, Any] = {}

    def one(i: int) -> None:
        ctx = make_ctx(Recorder(batches=batches), models_dir=models_dir)
        results[i] = render(ctx, names, sets[i], seed=i)[0]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(sets))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(batches) > 1
    for i in range(len(sets)):
        assert torch.allclose(results[i], solo[i], atol=1e-4), sets[i]
    assert not torch.allclose(solo[1], solo[2], atol=1e-3)  # the strength reaches the rows
    # one base model for every LoRA set, its weights untouched
    again = run(make_ctx(models_dir=models_dir), "load/diffusion-model",
                {"file": names["model"]})["model"]
    assert again.transformer is base.transformer
    assert counters_report().get("denoiser_loads", 0) == loads  # the heartbeat's counter
    for key, value in base.transformer.state_dict().items():
        assert torch.equal(value, before[key]), key


def test_a_lora_swapped_under_the_same_name_renders_a_new_image(lora_stack, make_ctx, tmp_path):
    from workers.models.flux1.tiny import write_smoke_stack, write_tiny_lora

    names = write_smoke_stack(tmp_path)
    write_tiny_lora(tmp_path, "swap.safetensors", seed=5)
    ctx = make_ctx(models_dir=tmp_path)
    first, _ = render(ctx, names, (("swap.safetensors", 1.0),))
    first_sha = ctx.lineage["loras"]["loras/swap.safetensors"]["sha256"]
    write_tiny_lora(tmp_path, "swap.safetensors", seed=6)
    ctx = make_ctx(models_dir=tmp_path)
    second, _ = render(ctx, names, (("swap.safetensors", 1.0),))
    assert ctx.lineage["loras"]["loras/swap.safetensors"]["sha256"] != first_sha
    assert not torch.allclose(first, second, atol=1e-3)


def test_a_lora_of_another_model_fails_naming_the_file(lora_stack, make_ctx):
    from safetensors.torch import save_file

    models_dir, names = lora_stack
    sdxl_like = {"lora_unet_down_blocks_1_attentions_0_proj_in.lora_down.weight": torch.zeros(4, 8),
                 "lora_unet_down_blocks_1_attentions_0_proj_in.lora_up.weight": torch.zeros(8, 4)}
    save_file(sdxl_like, models_dir / "loras" / "other.safetensors")
    ctx = make_ctx(models_dir=models_dir)
    model = run(ctx, "load/diffusion-model", {"file": names["model"]})["model"]
    with pytest.raises(NodeFailed, match=r"loras/other\.safetensors.*flux1"):
        run(ctx, "load/lora", {"lora": "other.safetensors", "strength": 1.0}, {"model": model})


# --- SDXL: kohya's sgm names, and CFG (a job's two rows carry its LoRAs) ------------------------

SDXL_GUIDANCE, NEGATIVE = 4.0, "blurry"  # the farm's guidance 4 is the pipeline's scale 5


@pytest.fixture(scope="module")
def sdxl_lora_stack(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    from workers.models.sdxl.tiny import write_smoke_stack, write_tiny_lora

    models_dir = tmp_path_factory.mktemp("sdxl-lora-models")
    names = write_smoke_stack(models_dir)
    for seed in range(2):
        names[f"lora{seed}"] = write_tiny_lora(models_dir, f"xl-{seed}.safetensors", seed=seed)
    return models_dir, names


def render_sdxl(ctx: Any, names: dict[str, str], loras: tuple[tuple[str, float], ...] = (),
                seed: int = 7) -> tuple[Any, Any]:
    loaded = run(ctx, "load/checkpoint", {"file": names["checkpoint"]})
    model = loaded["model"]
    for name, strength in loras:
        model = run(ctx, "load/lora", {"lora": name, "strength": strength},
                    {"model": model})["model"]
    encoder = loaded["encoder"]
    positive = run(ctx, "encode/text", {"text": PROMPT}, {"encoder": encoder})["conditioning"]
    negative = run(ctx, "encode/text", {"text": NEGATIVE}, {"encoder": encoder})["conditioning"]
    empty = run(ctx, "latent/empty", {"width": W, "height": H})["latent"]
    params = {"seed": seed, "steps": STEPS, "guidance": SDXL_GUIDANCE, "denoise": 1.0}
    latent = run(ctx, "sample", params, {"model": model, "positive": positive,
                                         "negative": negative, "latent": empty})["latent"]
    return latent.samples, run(ctx, "vae/decode", {}, {"vae": loaded["vae"],
                                                       "latent": latent})["image"]


def test_sdxl_loras_are_recognised_and_a_render_is_what_the_sdxl_pipeline_paints(
        sdxl_lora_stack, make_ctx):
    from workers.models.sdxl.tiny import smoke_pipeline

    models_dir, names = sdxl_lora_stack
    entry = {(e["folder"], e["name"]): e for e in scan(models_dir)}[("loras", names["lora0"])]
    assert (entry["role"], entry["family"]) == ("lora", "sdxl")
    loras = ((names["lora0"], 0.9), (names["lora1"], 0.5))
    _, ours = render_sdxl(make_ctx(models_dir=models_dir), names, loras)
    pipe = smoke_pipeline()
    for i, (name, _) in enumerate(loras):
        pipe.load_lora_weights(str(models_dir / "loras" / name), adapter_name=f"a{i}")
    pipe.set_adapters(["a0", "a1"], adapter_weights=[s for _, s in loras])
    theirs = pipe(PROMPT, negative_prompt=NEGATIVE, height=H, width=W,
                  num_inference_steps=STEPS, guidance_scale=SDXL_GUIDANCE + 1,
                  generator=torch.Generator("cpu").manual_seed(7)).images[0]
    assert max_diff(ours, theirs) <= 1
    _, plain = render_sdxl(make_ctx(models_dir=models_dir), names)
    assert max_diff(ours, plain) > 8


def assert_sdxl_sets_share_forwards_as_solo(make_ctx: Any, models_dir: Any, names: Any,
                                            sets: list[tuple[tuple[str, float], ...]]) -> None:
    """SDXL renders with these LoRA sets, on threads at once: they share forwards (a progress
    report with batch > 1) and each equals its render alone."""
    solo = [render_sdxl(make_ctx(models_dir=models_dir), names, s, seed=i)[0]
            for i, s in enumerate(sets)]
    batches: list[int] = []
    results: dict[int, Any] = {}

    def one(i: int) -> None:
        results[i] = render_sdxl(make_ctx(Recorder(batches=batches), models_dir=models_dir), names, sets[i],
                                 seed=i)[0]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(sets))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(batches) > 1
    for i in range(len(sets)):
        assert torch.allclose(results[i], solo[i], atol=1e-4), sets[i]


def test_sdxl_cfg_runs_with_and_without_loras_share_forwards(sdxl_lora_stack, make_ctx):
    models_dir, names = sdxl_lora_stack
    sets: list[tuple[tuple[str, float], ...]] = [
        (), ((names["lora0"], 1.0),), ((names["lora1"], 0.7),),
        ((names["lora0"], 0.5), (names["lora1"], 0.5))]
    assert_sdxl_sets_share_forwards_as_solo(make_ctx, models_dir, names, sets)


# --- Z-Image: kohya keys, per-item lists (a CFG job's two items carry its LoRAs) ----------------

ZW, ZH, Z_GUIDANCE = 64, 64, 3.0  # the pipeline's guidance_scale is the farm's guidance here


@pytest.fixture(scope="module")
def zimage_lora_stack(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    from workers.models.zimage.tiny import write_smoke_stack, write_tiny_lora

    models_dir = tmp_path_factory.mktemp("zimage-lora-models")
    names = write_smoke_stack(models_dir)
    for seed in range(2):
        names[f"lora{seed}"] = write_tiny_lora(models_dir, f"z-{seed}.safetensors", seed=seed)
    return models_dir, names


def render_zimage(ctx: Any, names: dict[str, str], loras: tuple[tuple[str, float], ...] = (),
                  seed: int = 7, guidance: float = Z_GUIDANCE) -> tuple[Any, Any]:
    model = run(ctx, "load/diffusion-model", {"file": names["model"]})["model"]
    for name, strength in loras:
        model = run(ctx, "load/lora", {"lora": name, "strength": strength},
                    {"model": model})["model"]
    vae = run(ctx, "load/vae", {"file": names["vae"]})["vae"]
    encoder = run(ctx, "load/text-encoder", {"file": names["text_encoder"]})["encoder"]
    positive = run(ctx, "encode/text", {"text": PROMPT}, {"encoder": encoder})["conditioning"]
    empty = run(ctx, "latent/empty", {"width": ZW, "height": ZH})["latent"]
    params = {"seed": seed, "steps": STEPS, "guidance": guidance, "denoise": 1.0}
    latent = run(ctx, "sample", params, {"model": model, "positive": positive,
                                         "latent": empty})["latent"]
    return latent.samples, run(ctx, "vae/decode", {}, {"vae": vae, "latent": latent})["image"]


def test_z_image_loras_are_recognised_and_a_render_is_what_z_image_pipeline_paints(
        zimage_lora_stack, make_ctx):
    from workers.models.zimage.tiny import smoke_pipeline

    models_dir, names = zimage_lora_stack
    entry = {(e["folder"], e["name"]): e for e in scan(models_dir)}[("loras", names["lora0"])]
    assert (entry["role"], entry["family"]) == ("lora", "zimage")
    loras = ((names["lora0"], 1.0), (names["lora1"], 0.6))
    _, ours = render_zimage(make_ctx(models_dir=models_dir), names, loras)
    pipe = smoke_pipeline()
    for i, (name, _) in enumerate(loras):
        pipe.load_lora_weights(str(models_dir / "loras" / name), adapter_name=f"a{i}")
    pipe.set_adapters(["a0", "a1"], adapter_weights=[s for _, s in loras])
    theirs = pipe(PROMPT, height=ZH, width=ZW, num_inference_steps=STEPS,
                  guidance_scale=Z_GUIDANCE,
                  generator=torch.Generator("cpu").manual_seed(7)).images[0]
    assert max_diff(ours, theirs) <= 1
    _, plain = render_zimage(make_ctx(models_dir=models_dir), names)
    assert max_diff(ours, plain) > 8


def test_z_image_runs_with_and_without_loras_and_cfg_share_forwards(zimage_lora_stack, make_ctx):
    models_dir, names = zimage_lora_stack
    runs: list[tuple[tuple[tuple[str, float], ...], float]] = [
        ((), Z_GUIDANCE), (((names["lora0"], 1.0),), 0.0), (((names["lora1"], 0.7),), Z_GUIDANCE),
        (((names["lora0"], 0.5), (names["lora1"], 0.5)), Z_GUIDANCE)]
    solo = [render_zimage(make_ctx(models_dir=models_dir), names, s, seed=i, guidance=g)[0]
            for i, (s, g) in enumerate(runs)]
    batches: list[int] = []
    results: dict[int, Any] = {}

    def one(i: int) -> None:
        loras, guidance = runs[i]
        results[i] = render_zimage(make_ctx(Recorder(batches=batches), models_dir=models_dir), names, loras,
                                   seed=i, guidance=guidance)[0]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(runs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(batches) > 1
    for i in range(len(runs)):
        assert torch.allclose(results[i], solo[i], atol=1e-4), runs[i]


def test_a_forward_applies_at_most_max_loras_distinct_loras_and_the_rest_wait():
    from workers.models.lora import AppliedLora, LoraWeights
    from workers.sampling import SampleJob, StepBatcher

    seen: list[set[int]] = []

    def predict(jobs: list[SampleJob]) -> list[Any]:
        if not seen:  # the first forward (one job: whoever came first) waits for every job to
            # have joined, so the next ones choose among all five whatever the machine's load
            deadline = time.monotonic() + 30
            while len(batcher._active) < len(sets) and time.monotonic() < deadline:
                time.sleep(0.01)
        seen.append({id(a.weights) for job in jobs for a in job.loras})
        return [torch.zeros_like(job.latents) for job in jobs]

    files = [LoraWeights(f"l{i}.safetensors", str(i), {}) for i in range(3)]
    sets = [(AppliedLora(files[0], 1.0),), (AppliedLora(files[1], 1.0),),
            (AppliedLora(files[2], 1.0),), (AppliedLora(files[0], 0.5),), ()]
    batcher = StepBatcher(predict, gather_seconds=0.5, max_loras=2)
    jobs = [SampleJob(latents=torch.zeros(1, 4, 2, 2), sigmas=torch.linspace(1, 0, 4),
                      timesteps=torch.linspace(1000, 10, 3), positive=torch.zeros(1, 4), loras=s)
            for s in sets]
    threads = [threading.Thread(target=batcher.run, args=(job,)) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(job.done for job in jobs)
    assert max(len(s) for s in seen) == 2 and max(batcher.sizes) > 1


def test_the_node_cache_key_of_a_lora_node_follows_the_file_s_content(settings, tmp_path):
    """The executor keys a load/lora node (and so everything downstream) on the LoRA file's
    sha256: the same name with other bytes is another key, the same bytes the same key."""
    from apps.graphs.registry import descriptor_get
    from apps.graphs.schema import NodeSpec
    from workers.executor import _model_contents, node_key
    from workers.models.flux1.tiny import write_tiny_lora

    settings.INLINE_MODELS_DIR = tmp_path
    spec = NodeSpec.model_validate({"type": "load/lora",
                                    "params": {"lora": "swap.safetensors", "strength": 0.8}})
    descriptor = descriptor_get("load/lora")

    def key() -> str:
        return node_key(spec, {}, content=_model_contents(spec, descriptor))

    write_tiny_lora(tmp_path, "swap.safetensors", seed=1)
    first = key()
    assert _model_contents(spec, descriptor) == {
        "loras/swap.safetensors": file_sha256(tmp_path / "loras" / "swap.safetensors")}
    assert key() == first
    write_tiny_lora(tmp_path, "swap.safetensors", seed=2)
    assert key() != first


# --- the text-encoder half (strength_clip): ComfyUI's LoraLoader's CLIP side --------------------


def lora_with_clip(ctx: Any, model: Any, encoder: Any, name: str, strength: float,
                   strength_clip: float) -> tuple[Any, Any]:
    out = run(ctx, "load/lora", {"lora": name, "strength": strength,
                                 "strength_clip": strength_clip},
              {"model": model, "encoder": encoder})
    return out["model"], out["encoder"]


def render_sdxl_te(ctx: Any, names: dict[str, str], loras: tuple[tuple[str, float, float], ...],
                   seed: int = 7) -> tuple[Any, Any]:
    """render_sdxl with each LoRA's text-encoder half wired (name, strength, strength_clip)."""
    loaded = run(ctx, "load/checkpoint", {"file": names["checkpoint"]})
    model, encoder = loaded["model"], loaded["encoder"]
    for name, strength, strength_clip in loras:
        model, encoder = lora_with_clip(ctx, model, encoder, name, strength, strength_clip)
    positive = run(ctx, "encode/text", {"text": PROMPT}, {"encoder": encoder})["conditioning"]
    negative = run(ctx, "encode/text", {"text": NEGATIVE}, {"encoder": encoder})["conditioning"]
    empty = run(ctx, "latent/empty", {"width": W, "height": H})["latent"]
    params = {"seed": seed, "steps": STEPS, "guidance": SDXL_GUIDANCE, "denoise": 1.0}
    latent = run(ctx, "sample", params, {"model": model, "positive": positive,
                                         "negative": negative, "latent": empty})["latent"]
    return latent.samples, run(ctx, "vae/decode", {}, {"vae": loaded["vae"],
                                                       "latent": latent})["image"]


@pytest.fixture(scope="module")
def sdxl_te_names(sdxl_lora_stack) -> dict[str, str]:
    from workers.models.sdxl.tiny import write_tiny_lora

    models_dir, names = sdxl_lora_stack
    return {**names, **{f"te{seed}": write_tiny_lora(models_dir, f"xl-te-{seed}.safetensors",
                                                     seed=10 + seed, text_encoders=True)
                        for seed in range(2)}}


def test_an_sdxl_lora_s_clip_halves_paint_what_the_pipeline_paints_at_strength_clip(
        sdxl_lora_stack, sdxl_te_names, make_ctx):
    from workers.models.sdxl.tiny import smoke_pipeline

    models_dir, _ = sdxl_lora_stack
    names = sdxl_te_names
    loras = ((names["te0"], 0.9, 0.6), (names["te1"], 0.5, -0.8))
    ctx = make_ctx(models_dir=models_dir)
    _, ours = render_sdxl_te(ctx, names, loras)
    pipe = smoke_pipeline()
    for i, (name, _, _) in enumerate(loras):
        pipe.load_lora_weights(str(models_dir / "loras" / name), adapter_name=f"a{i}")
    assert set(pipe.get_list_adapters()) == {"unet", "text_encoder", "text_encoder_2"}
    pipe.set_adapters(["a0", "a1"], adapter_weights=[
        {"unet": s, "text_encoder": c, "text_encoder_2": c} for _, s, c in loras])
    theirs = pipe(PROMPT, negative_prompt=NEGATIVE, height=H, width=W,
                  num_inference_steps=STEPS, guidance_scale=SDXL_GUIDANCE + 1,
                  generator=torch.Generator("cpu").manual_seed(7)).images[0]
    assert max_diff(ours, theirs) <= 1
    _, unet_only = render_sdxl_te(make_ctx(models_dir=models_dir), names,
                                  tuple((n, s, 0.0) for n, s, _ in loras))
    _, model_only = render_sdxl(make_ctx(models_dir=models_dir), names,
                                tuple((n, s) for n, s, _ in loras))
    assert max_diff(unet_only, model_only) == 0  # strength_clip 0: the encoder passes unchanged
    assert max_diff(ours, unet_only) > 8  # the CLIP halves do change the image
    file = lambda n: file_sha256(models_dir / "loras" / n)  # noqa: E731
    assert ctx.lineage["loras"] == {f"loras/{n}": {"sha256": file(n), "strength": s}
                                    for n, s, _ in loras}
    assert ctx.lineage["textEncoderLoras"] == {f"loras/{n}": {"sha256": file(n), "strength": c}
                                               for n, _, c in loras}


def test_encodes_with_different_clip_loras_share_one_encoder_forward(sdxl_lora_stack,
                                                                    sdxl_te_names, make_ctx):
    """Texts of other LoRA sets (and none) in one batched encode: each equals its lone encode,
    and the shared base encoder's weights are untouched."""
    from workers.models.lora import encode_rows
    from workers.models.sdxl.engine import encode_prompts
    from workers.runners.diffusion import encode

    models_dir, _ = sdxl_lora_stack
    names = sdxl_te_names
    ctx = make_ctx(models_dir=models_dir)
    loaded = run(ctx, "load/checkpoint", {"file": names["checkpoint"]})
    base = loaded["encoder"]
    before = {k: v.clone() for k, v in base.model[0].state_dict().items()}
    encoders = [base]
    for name, clip in ((names["te0"], 1.0), (names["te0"], 0.4), (names["te1"], 0.7)):
        encoders.append(lora_with_clip(ctx, loaded["model"], base, name, 1.0, clip)[1])
    encoders.append(lora_with_clip(ctx, loaded["model"], encoders[1], names["te1"], 1.0, 0.7)[1])
    lone = [encode(e, PROMPT) for e in encoders]
    # what the encode coalescer runs for requests that arrive together: one call, mixed rows
    batched = encode_rows(encode_prompts, base, [(PROMPT, e.loras) for e in encoders])
    for one, together in zip(lone, batched, strict=True):
        assert torch.allclose(one.embeds, together.embeds, atol=1e-5)
        assert torch.allclose(one.pooled, together.pooled, atol=1e-5)
    assert not torch.allclose(lone[0].embeds, lone[1].embeds, atol=1e-3)
    assert not torch.allclose(lone[1].embeds, lone[2].embeds, atol=1e-3)  # strength_clip counts
    for key, value in base.model[0].state_dict().items():
        assert torch.equal(value, before[key]), key


def test_a_flux_lora_s_clip_l_half_paints_what_flux_pipeline_paints(lora_stack, make_ctx):
    from workers.models.flux1.tiny import smoke_pipeline, write_tiny_lora

    models_dir, names = lora_stack
    name = write_tiny_lora(models_dir, "clip-style.safetensors", seed=20, text_encoder=True)
    ctx = make_ctx(models_dir=models_dir)
    model = run(ctx, "load/diffusion-model", {"file": names["model"]})["model"]
    encoder = run(ctx, "load/text-encoder", {"file": names["text_encoder"],
                                             "file_2": names["text_encoder_2"]})["encoder"]

    def paint(strength_clip: float) -> Any:
        m, e = lora_with_clip(ctx, model, encoder, name, 0.8, strength_clip)
        positive = run(ctx, "encode/text", {"text": PROMPT}, {"encoder": e})["conditioning"]
        empty = run(ctx, "latent/empty", {"width": W, "height": H})["latent"]
        params = {"seed": 7, "steps": STEPS, "guidance": GUIDANCE, "denoise": 1.0}
        latent = run(ctx, "sample", params, {"model": m, "positive": positive,
                                             "latent": empty})["latent"]
        vae = run(ctx, "load/vae", {"file": names["vae"]})["vae"]
        return run(ctx, "vae/decode", {}, {"vae": vae, "latent": latent})["image"]

    ours = paint(1.3)
    pipe = smoke_pipeline()
    pipe.load_lora_weights(str(models_dir / "loras" / name), adapter_name="a")
    pipe.set_adapters(["a"], adapter_weights=[{"transformer": 0.8, "text_encoder": 1.3}])
    theirs = pipe(PROMPT, height=H, width=W, num_inference_steps=STEPS, guidance_scale=GUIDANCE,
                  generator=torch.Generator("cpu").manual_seed(7)).images[0]
    assert max_diff(ours, theirs) <= 1
    assert max_diff(ours, paint(0.0)) > 8


def test_a_flux_lora_with_a_t5_half_is_refused_naming_the_file_unless_strength_clip_is_0(
        lora_stack, make_ctx):
    from safetensors.torch import load_file, save_file

    models_dir, names = lora_stack
    state = load_file(str(models_dir / "loras" / names["lora0"]))
    state["lora_te2_encoder_block_0_layer_0_SelfAttention_q.lora_down.weight"] = torch.ones(4, 32)
    state["lora_te2_encoder_block_0_layer_0_SelfAttention_q.lora_up.weight"] = torch.ones(32, 4)
    save_file(state, models_dir / "loras" / "with-t5.safetensors")
    ctx = make_ctx(models_dir=models_dir)
    model = run(ctx, "load/diffusion-model", {"file": names["model"]})["model"]
    encoder = run(ctx, "load/text-encoder", {"file": names["text_encoder"],
                                             "file_2": names["text_encoder_2"]})["encoder"]
    with pytest.raises(NodeFailed, match=r"loras/with-t5\.safetensors has T5 .*strength_clip"):
        lora_with_clip(ctx, model, encoder, "with-t5.safetensors", 1.0, 1.0)
    _, same = lora_with_clip(ctx, model, encoder, "with-t5.safetensors", 1.0, 0.0)
    assert same is encoder


def test_z_image_passes_its_encoder_on_and_refuses_a_text_encoder_half(zimage_lora_stack,
                                                                        make_ctx):
    from safetensors.torch import load_file, save_file

    models_dir, names = zimage_lora_stack
    ctx = make_ctx(models_dir=models_dir)
    model = run(ctx, "load/diffusion-model", {"file": names["model"]})["model"]
    encoder = run(ctx, "load/text-encoder", {"file": names["text_encoder"]})["encoder"]
    m, same = lora_with_clip(ctx, model, encoder, names["lora0"], 1.0, 1.0)
    assert same is encoder and len(m.loras) == 1  # no text-encoder half: nothing to apply
    state = load_file(str(models_dir / "loras" / names["lora0"]))
    state["lora_te_layers_0_self_attn_q_proj.lora_down.weight"] = torch.ones(4, 8)
    state["lora_te_layers_0_self_attn_q_proj.lora_up.weight"] = torch.ones(8, 4)
    save_file(state, models_dir / "loras" / "z-te.safetensors")
    with pytest.raises(NodeFailed, match=r"loras/z-te\.safetensors has text-encoder weights.*"
                                         r"zimage.*strength_clip"):
        lora_with_clip(ctx, model, encoder, "z-te.safetensors", 1.0, 1.0)


# --- LoCon: kohya conv LoRAs on SDXL's UNet resnets ---------------------------------------------


def test_an_sdxl_locon_paints_what_the_pipeline_paints_and_batches_with_other_sets(
        sdxl_lora_stack, make_ctx):
    from workers.models.sdxl.tiny import smoke_pipeline, write_tiny_lora

    models_dir, names = sdxl_lora_stack
    locon = write_tiny_lora(models_dir, "xl-locon.safetensors", seed=30, locon=True)
    loras = ((locon, 0.8), (names["lora1"], 0.5))
    _, ours = render_sdxl(make_ctx(models_dir=models_dir), names, loras)
    pipe = smoke_pipeline()
    for i, (name, _) in enumerate(loras):
        pipe.load_lora_weights(str(models_dir / "loras" / name), adapter_name=f"a{i}")
    assert "a0" in pipe.unet.down_blocks[0].resnets[0].conv1.lora_A  # diffusers loads the convs
    pipe.set_adapters(["a0", "a1"], adapter_weights=[s for _, s in loras])
    theirs = pipe(PROMPT, negative_prompt=NEGATIVE, height=H, width=W,
                  num_inference_steps=STEPS, guidance_scale=SDXL_GUIDANCE + 1,
                  generator=torch.Generator("cpu").manual_seed(7)).images[0]
    assert max_diff(ours, theirs) <= 1
    _, linear_only = render_sdxl(make_ctx(models_dir=models_dir), names,
                                 ((write_tiny_lora(models_dir, "xl-linear.safetensors", seed=30),
                                   0.8), (names["lora1"], 0.5)))
    assert max_diff(ours, linear_only) > 8  # the conv deltas do change the image

    sets: list[tuple[tuple[str, float], ...]] = [
        (), ((locon, 1.0),), ((locon, 0.4),), ((locon, 0.7), (names["lora0"], 0.5))]
    assert_sdxl_sets_share_forwards_as_solo(make_ctx, models_dir, names, sets)


def test_a_conv_lora_of_the_wrong_kernel_fails_naming_the_file_and_the_layer(sdxl_lora_stack,
                                                                             make_ctx):
    from safetensors.torch import save_file

    models_dir, names = sdxl_lora_stack
    key = "lora_unet_input_blocks_1_0_in_layers_2"
    save_file({f"{key}.lora_down.weight": torch.zeros(4, 32, 5, 5),
               f"{key}.lora_up.weight": torch.zeros(32, 4, 1, 1)},
              models_dir / "loras" / "bad-kernel.safetensors")
    ctx = make_ctx(models_dir=models_dir)
    model = run(ctx, "load/checkpoint", {"file": names["checkpoint"]})["model"]
    with pytest.raises(NodeFailed, match=r"loras/bad-kernel\.safetensors does not fit "
                                         r"down_blocks\.0\.resnets\.0\.conv1: .*kernel \(3, 3\)"):
        run(ctx, "load/lora", {"lora": "bad-kernel.safetensors", "strength": 1.0},
            {"model": model})


@pytest.mark.django_db
def test_a_run_s_take_names_both_halves_and_the_cache_keys_on_strength_clip(
        sdxl_lora_stack, sdxl_te_names, settings):
    """Through the executor: a LoRA with both halves, then a model-only one (its node does not
    see the encoder, yet the take keeps the first's text-encoder half); another strength_clip
    re-encodes (the node cache keys on it) and paints another image; the same one reuses the
    cached encode."""
    from apps.takes.models import Take
    from tests.workers.vocab_helpers import render as execute_graph
    from tests.workers.vocab_helpers import wire
    from workers.nodecache import NodeCache

    models_dir, _ = sdxl_lora_stack
    names = sdxl_te_names
    settings.INLINE_MODELS_DIR = models_dir
    sha = {n: file_sha256(models_dir / "loras" / names[n]) for n in ("te0", "lora1")}

    def nodes(strength_clip: float) -> dict[str, Any]:
        return {
            "ckpt": {"type": "load/checkpoint", "params": {"file": names["checkpoint"]}},
            "both": {"type": "load/lora", "params": {"lora": names["te0"], "strength": 0.9,
                                                     "strength_clip": strength_clip},
                     "inputs": {"model": wire("ckpt", "model"),
                                "encoder": wire("ckpt", "encoder")}},
            "unet": {"type": "load/lora", "params": {"lora": names["lora1"], "strength": 0.5},
                     "inputs": {"model": wire("both", "model")}},
            "pos": {"type": "encode/text", "params": {"text": PROMPT},
                    "inputs": {"encoder": wire("both", "encoder")}},
            "empty": {"type": "latent/empty", "params": {"width": W, "height": H}},
            "sample": {"type": "sample", "params": {"seed": 3, "steps": STEPS, "guidance": 0.0},
                       "inputs": {"model": wire("unet", "model"),
                                  "positive": wire("pos", "conditioning"),
                                  "latent": wire("empty", "latent")}},
            "decode": {"type": "vae/decode", "inputs": {"vae": wire("ckpt", "vae"),
                                                        "latent": wire("sample", "latent")}},
            "save": {"type": "image/save", "inputs": {"image": wire("decode", "image")}}}

    cache = NodeCache(256 << 20)
    first, run = execute_graph(nodes(0.6), "save", cache=cache)
    assert first.status == "succeeded", first.error
    take = Take.objects.get(run=run)
    assert take.lineage["loras"] == {
        f"loras/{names['te0']}": {"sha256": sha["te0"], "strength": 0.9},
        f"loras/{names['lora1']}": {"sha256": sha["lora1"], "strength": 0.5}}
    assert take.lineage["textEncoderLoras"] == {
        f"loras/{names['te0']}": {"sha256": sha["te0"], "strength": 0.6}}
    def cached(run: Any) -> set[str]:
        return {e.payload["nodeId"] for e in run.events.filter(type="node_done")
                if e.payload["cached"]}

    other, again = execute_graph(nodes(-0.6), "save", cache=cache)
    assert other.status == "succeeded", other.error
    assert "empty" in cached(again) and "pos" not in cached(again)  # re-encoded
    assert Take.objects.get(run=again).sha256 != take.sha256
    _, same = execute_graph(nodes(-0.6), "save", cache=cache)
    assert {"pos", "sample"} <= cached(same)  # the same strength_clip: the cached encode
    assert Take.objects.get(run=same).sha256 == Take.objects.get(run=again).sha256
