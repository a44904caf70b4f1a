"""MiniMax-H3 registered: its tiny folder in checkpoints/ recognised and loaded by load/checkpoint,
clips through minimaxh3/image-to-video → minimaxh3/sample → minimaxh3/decode equal to diffusers'
MiniMaxH3ModularPipeline (t2va and fl2va), the sampler's progress and cancel on the step batcher,
and clear node errors."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from tests.workers.conftest import Recorder
from workers.models.catalog import scan
from workers.runners import RUNNERS
from workers.runners.base import NodeFailed, RunCancelled

W, H, FRAMES, STEPS = 64, 32, 124, 2  # the shortest clip; 2 steps = the pipeline's 3 points
PROMPT = "a robot dancing"


@pytest.fixture(scope="module")
def h3_stack(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    from workers.models.minimaxh3.plugin import write_tiny_stack

    models_dir = tmp_path_factory.mktemp("minimaxh3-models")
    return models_dir, write_tiny_stack(models_dir)["checkpoint"]


@pytest.fixture(scope="module")
def reference() -> Any:
    from workers.models.minimaxh3.tiny import smoke_pipeline

    return smoke_pipeline()


def run(ctx: Any, node_type: str, params: dict[str, Any], inputs: dict[str, Any] | None = None) -> Any:
    return RUNNERS[node_type](ctx, params, inputs or {})


def render(ctx: Any, name: str, ends: dict[str, Image.Image] | None = None, seed: int = 5,
           lora: tuple[str, float] | None = None, **shifts: float) -> Any:
    parts = run(ctx, "load/checkpoint", {"file": name})
    if lora is not None:
        parts["model"] = run(ctx, "load/lora", {"lora": lora[0], "strength": lora[1],
                                                "strength_clip": 0.0},
                             {"model": parts["model"]})["model"]
    request = run(ctx, "minimaxh3/image-to-video",
                  {"prompt": PROMPT, "width": W, "height": H, "length": FRAMES},
                  {"encoder": parts["encoder"], "vae": parts["vae"], **(ends or {})})
    sampled = run(ctx, "minimaxh3/sample", {"seed": seed, "steps": STEPS, **shifts},
                  {"model": parts["model"], "positive": request["positive"],
                   "latent": request["latent"]})["latent"]
    return run(ctx, "minimaxh3/decode", {}, {"vae": parts["vae"], "latent": sampled})["video"]


def keyframe(seed: int, height: int, width: int) -> Image.Image:
    pixels = np.random.default_rng(seed).random((height, width, 3)) * 255
    return Image.fromarray(pixels.astype("uint8"))


def test_the_stack_is_one_checkpoint_folder_recognised_as_minimaxh3(h3_stack):
    models_dir, name = h3_stack
    entries = [e for e in scan(models_dir) if e["name"] == name]
    assert [(e["folder"], e["family"], e["role"], e["kind"]) for e in entries] == [
        ("checkpoints", "minimaxh3", "checkpoint", "dir")]


@pytest.mark.parametrize("ends", [(), ("first_frame", "last_frame")])
def test_a_clip_through_the_nodes_is_the_modular_pipeline_s(h3_stack, make_ctx, reference, ends):
    images = {"first_frame": keyframe(0, 48, 80), "last_frame": keyframe(1, 40, 40)}
    given = {end: images[end] for end in ends}
    models_dir, name = h3_stack
    recorder = Recorder()
    video = render(make_ctx(recorder, models_dir=models_dir), name, given)
    assert recorder.progress == [(1, STEPS), (STEPS, STEPS)] and set(recorder.frames) == {FRAMES}
    assert set(recorder.batches) == {1}  # one run: its own forward each step
    pipeline_ends = {"image" if end == "first_frame" else "last_image": image
                     for end, image in given.items()}
    state = reference(prompt=PROMPT, generator=torch.Generator("cpu").manual_seed(5),
                      num_inference_steps=STEPS + 1, height=H, width=W, num_frames=FRAMES,
                      output_type="pt", **pipeline_ends)
    want = (state.get("videos")[0].permute(0, 2, 3, 1).numpy() * 255).round().astype(np.uint8)
    np.testing.assert_array_equal(video.frames.array, want)
    np.testing.assert_array_equal(video.audio.samples, state.get("audio")[0].numpy())
    assert video.fps == 24 and video.audio.sample_rate == 160


def test_the_shifts_of_minimax_h3_sigma_shift_are_the_pipeline_schedulers_shifts(h3_stack,
                                                                                 make_ctx):
    """shift_video 10 / shift_audio 2 (FastH3's MiniMaxH3SigmaShift is 10 / 3): the pipeline
    with MiniMaxH3Scheduler(shift=10) and (shift=2); the default shifts paint another clip."""
    from workers.models.minimaxh3.tiny import smoke_pipeline

    models_dir, name = h3_stack
    video = render(make_ctx(models_dir=models_dir), name, shift_video=10.0, shift_audio=2.0)
    state = smoke_pipeline(shifts=(10.0, 2.0))(
        prompt=PROMPT, generator=torch.Generator("cpu").manual_seed(5),
        num_inference_steps=STEPS + 1, height=H, width=W, num_frames=FRAMES, output_type="pt")
    want = (state.get("videos")[0].permute(0, 2, 3, 1).numpy() * 255).round().astype(np.uint8)
    np.testing.assert_array_equal(video.frames.array, want)
    np.testing.assert_array_equal(video.audio.samples, state.get("audio")[0].numpy())
    plain = render(make_ctx(models_dir=models_dir), name)
    assert not np.array_equal(plain.frames.array, video.frames.array)


def test_the_sampler_stops_within_a_step_when_cancelled(h3_stack, make_ctx):
    models_dir, name = h3_stack
    recorder = Recorder(cancel_after_step=1)
    with pytest.raises(RunCancelled):
        render(make_ctx(recorder, models_dir=models_dir), name)
    assert recorder.progress == [(1, STEPS)]


def test_bad_requests_and_wiring_are_named(h3_stack, make_ctx):
    models_dir, name = h3_stack
    ctx = make_ctx(models_dir=models_dir)
    parts = run(ctx, "load/checkpoint", {"file": name})
    wired = {"encoder": parts["encoder"], "vae": parts["vae"]}
    with pytest.raises(NodeFailed, match=r"5 to 15 s clips .* length 48"):
        run(ctx, "minimaxh3/image-to-video",
            {"prompt": PROMPT, "width": W, "height": H, "length": 48}, wired)
    plain = run(ctx, "encode/text", {"text": PROMPT}, {"encoder": parts["encoder"]})
    keyed = run(ctx, "minimaxh3/image-to-video",
                {"prompt": PROMPT, "width": W, "height": H, "length": FRAMES},
                {**wired, "first_frame": keyframe(0, 32, 64)})
    with pytest.raises(NodeFailed, match=r"encoded with 0 image\(s\) and the latent holds 1"):
        run(ctx, "minimaxh3/sample", {"seed": 0, "steps": STEPS},
            {"model": parts["model"], "positive": plain["conditioning"],
             "latent": keyed["latent"]})
    with pytest.raises(NodeFailed, match="empty latent holds no clip"):
        run(ctx, "minimaxh3/decode", {}, {"vae": parts["vae"], "latent": keyed["latent"]})


def test_a_comfyui_lora_applies_to_its_run_only(h3_stack, make_ctx):
    """A LoRA in ComfyUI's keys (`diffusion_model.blocks.N.attn.qkv_proj`, read by diffusers'
    MiniMaxH3LoraLoaderMixin: the fused qkv split) changes its run's clip; strength 0 and a run
    without it keep the base clip."""
    from safetensors.torch import save_file

    from workers.models.families import identify
    from workers.models.minimaxh3 import keys
    from workers.models.minimaxh3.tiny import build_tiny_components

    models_dir, name = h3_stack
    original = keys.to_original(build_tiny_components()["transformer"].state_dict())
    generator = torch.Generator().manual_seed(0)
    state = {}
    for key in ("model.diffusion_model.blocks.0.attn.qkv_proj.weight",
                "model.diffusion_model.blocks.1.attn.out_proj.weight",
                "model.diffusion_model.blocks.1.adaln_proj.linear.weight"):
        out, into = original[key].shape
        module = key.removeprefix("model.").removesuffix(".weight")
        state[f"{module}.lora_A.weight"] = torch.randn(4, into, generator=generator)
        state[f"{module}.lora_B.weight"] = torch.randn(out, 4, generator=generator)
    (models_dir / "loras").mkdir(exist_ok=True)
    save_file(state, models_dir / "loras" / "h3-lora.safetensors")
    assert identify(models_dir / "loras" / "h3-lora.safetensors", "loras").families == (
        "minimaxh3",)
    ctx = make_ctx(models_dir=models_dir)
    base = render(ctx, name).frames.array
    assert not np.array_equal(render(ctx, name, lora=("h3-lora.safetensors", 1.0)).frames.array,
                              base)
    np.testing.assert_array_equal(
        render(ctx, name, lora=("h3-lora.safetensors", 0.0)).frames.array, base)
    np.testing.assert_array_equal(render(ctx, name).frames.array, base)


def test_concurrent_runs_step_together_and_equal_their_solo_renders(h3_stack, make_ctx):
    """Runs in flight at once step on the model's batcher in the same iterations, each with a
    forward of its own (packed sequences differ): progress says `batch` 1, and each clip is its
    solo render exactly."""
    models_dir, name = h3_stack
    ends: list[dict[str, Image.Image]] = [{}, {"first_frame": keyframe(2, 32, 64)}, {}]
    solo = [render(make_ctx(models_dir=models_dir), name, e, seed=i) for i, e in enumerate(ends)]
    recorders = [Recorder() for _ in ends]
    videos: list[Any] = [None] * len(ends)

    def one(i: int) -> None:
        videos[i] = render(make_ctx(recorders[i], models_dir), name, ends[i], seed=i)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(ends))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {b for r in recorders for b in r.batches} == {1}
    model = run(make_ctx(models_dir=models_dir), "load/checkpoint", {"file": name})["model"]
    assert max(model.batcher.sizes) > 1  # iterations that stepped several runs
    for alone, together in zip(solo, videos, strict=True):
        np.testing.assert_array_equal(alone.frames.array, together.frames.array)
        np.testing.assert_array_equal(alone.audio.samples, together.audio.samples)


def test_reference_to_video_through_the_nodes_is_the_modular_pipeline_s_ref2va(h3_stack,
                                                                               make_ctx):
    from diffusers.modular_pipelines.minimax_h3 import MiniMaxH3ImageReference

    from workers.models.minimaxh3.tiny import smoke_pipeline

    models_dir, name = h3_stack
    ctx = make_ctx(Recorder(), models_dir=models_dir)
    images = [keyframe(0, 64, 32), keyframe(1, 48, 96)]  # 32×64 as it is, 96×48 → 64×32
    parts = run(ctx, "load/checkpoint", {"file": name})
    request = run(ctx, "minimaxh3/reference-to-video",
                  {"prompt": PROMPT, "width": W, "height": H, "length": FRAMES, "mode": "match"},
                  {"encoder": parts["encoder"], "vae": parts["vae"], "image1": images[0],
                   "image3": images[1]})  # the wired ones in order: <Picture 1>, <Picture 2>
    sampled = run(ctx, "minimaxh3/sample", {"seed": 5, "steps": STEPS},
                  {"model": parts["model"], "positive": request["positive"],
                   "latent": request["latent"]})["latent"]
    video = run(ctx, "minimaxh3/decode", {}, {"vae": parts["vae"], "latent": sampled})["video"]
    pipe = smoke_pipeline()
    pipe.update_components(transformer_ref=pipe.transformer)  # the model load/checkpoint gives
    pipe.register_to_config(reference_image_short_edge=32)  # sizes them as "match" does here
    state = pipe(prompt=PROMPT, generator=torch.Generator("cpu").manual_seed(5),
                 references=[MiniMaxH3ImageReference(image=image) for image in images],
                 num_inference_steps=STEPS + 1, height=H, width=W, num_frames=FRAMES,
                 output_type="pt")
    want = (state.get("videos")[0].permute(0, 2, 3, 1).numpy() * 255).round().astype(np.uint8)
    np.testing.assert_array_equal(video.frames.array, want)
    np.testing.assert_array_equal(video.audio.samples, state.get("audio")[0].numpy())


def test_reference_to_video_without_an_image_is_named(h3_stack, make_ctx):
    models_dir, name = h3_stack
    ctx = make_ctx(Recorder(), models_dir=models_dir)
    parts = run(ctx, "load/checkpoint", {"file": name})
    with pytest.raises(NodeFailed, match="wire at least one reference image"):
        run(ctx, "minimaxh3/reference-to-video",
            {"prompt": PROMPT, "width": W, "height": H, "length": FRAMES, "mode": "match"},
            {"encoder": parts["encoder"], "vae": parts["vae"]})


def test_reference_to_video_on_a_checkpoints_keyframe_partition_is_refused(h3_stack, make_ctx,
                                                                           tmp_path):
    """A released folder holds both partitions (transformer/: first/last frame; transformer_ref/:
    reference-to-video) and load/checkpoint loads transformer/: referencing on it is named, not
    rendered on the wrong weights."""
    import shutil

    models_dir, name = h3_stack
    both = tmp_path / "checkpoints" / "h3-both"
    shutil.copytree(models_dir / "checkpoints" / name, both)
    shutil.copytree(both / "transformer", both / "transformer_ref")
    ctx = make_ctx(models_dir=tmp_path)
    parts = run(ctx, "load/checkpoint", {"file": "h3-both"})
    request = run(ctx, "minimaxh3/reference-to-video",
                  {"prompt": PROMPT, "width": W, "height": H, "length": FRAMES, "mode": "match"},
                  {"encoder": parts["encoder"], "vae": parts["vae"], "image1": keyframe(0, 64, 32)})
    with pytest.raises(NodeFailed, match="h3-both's transformer/ is MiniMax-H3's first/last-frame "
                                         "partition: reference-to-video runs on its "
                                         "transformer_ref/"):
        run(ctx, "minimaxh3/sample", {"seed": 5, "steps": STEPS},
            {"model": parts["model"], "positive": request["positive"],
             "latent": request["latent"]})
