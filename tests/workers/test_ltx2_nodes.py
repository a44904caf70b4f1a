"""LTX-2 registered (issue 37): its tiny stack in checkpoints/ recognised and loaded by
load/checkpoint, a clip rendered through the generic encode node and the ltx2/* nodes equal to
diffusers' LTX2Pipeline, concurrent runs of one size sharing the step batcher's forwards, and
clear node errors."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.workers.conftest import Recorder
from workers.models.catalog import scan
from workers.runners import RUNNERS

W, H, FRAMES, FPS, STEPS = 32, 32, 9, 25.0, 3
PROMPT = "a robot dancing"
GUIDANCE = {"cfg": 3.0, "stg": 1.0, "modality": 3.0, "rescale": 0.7, "audio_cfg": 7.0,
            "audio_stg": 1.0, "audio_modality": 3.0, "audio_rescale": 0.7,
            "stg_blocks": "1"}  # the pipeline's defaults; its block 28 → the tiny one's 1


@pytest.fixture(scope="module")
def ltx2_stack(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    from workers.models.ltx2.plugin import write_tiny_stack

    models_dir = tmp_path_factory.mktemp("ltx2-models")
    return models_dir, write_tiny_stack(models_dir)["checkpoint"]


class PreviewRecorder(Recorder):
    def __init__(self) -> None:
        super().__init__()
        self.previews: list[bytes | None] = []

    def report(self, step: int, total: int, preview: bytes | None, batch: int | None = None) -> None:
        self.previews.append(preview)
        super().report(step, total, preview, batch)


def run(ctx: Any, node_type: str, params: dict[str, Any], inputs: dict[str, Any] | None = None) -> Any:
    return RUNNERS[node_type](ctx, params, inputs or {})


def render(ctx: Any, name: str, prompt: str = PROMPT, seed: int = 5, image: Any = None,
           sigmas: str | None = None, lora: tuple[str, float] | None = None,
           strength: float = 1.0, files: dict[str, str] | None = None) -> Any:
    """A clip of checkpoint `name` (or of ComfyUI's separate `files`: ltx2/load-files)."""
    parts = (run(ctx, "ltx2/load-files", files) if files is not None
             else run(ctx, "load/checkpoint", {"file": name}))
    if lora is not None:
        parts["model"] = run(ctx, "load/lora", {"lora": lora[0], "strength": lora[1],
                                                "strength_clip": 0.0},
                             {"model": parts["model"]})["model"]
    wired = {} if sigmas is None else run(ctx, "sampling/manual-sigmas", {"sigmas": sigmas})
    positive = run(ctx, "encode/text", {"text": prompt}, {"encoder": parts["encoder"]})
    latent = run(ctx, "ltx2/empty-latent", {"width": W, "height": H, "length": FRAMES,
                                            "fps": FPS})["latent"]
    if image is not None:
        latent = run(ctx, "ltx2/image-to-video", {"crf": -1, "strength": strength},
                     {"vae": parts["vae"], "image": image, "latent": latent})["latent"]
    sampled = run(ctx, "ltx2/sample", {"seed": seed, "steps": STEPS, **GUIDANCE},
                  {"model": parts["model"], "positive": positive["conditioning"],
                   "latent": latent, **wired})["latent"]
    return run(ctx, "ltx2/decode", {}, {"vae": parts["vae"], "latent": sampled})["video"]


def test_the_stack_is_one_checkpoint_folder_recognised_as_ltx2(ltx2_stack):
    models_dir, name = ltx2_stack
    entries = [e for e in scan(models_dir) if e["name"] == name]
    assert [(e["folder"], e["family"], e["role"], e["kind"]) for e in entries] == [
        ("checkpoints", "ltx2", "checkpoint", "dir")]


def test_a_clip_through_the_nodes_is_ltx2_pipeline_s(ltx2_stack, make_ctx):
    """Frames, fps and sound of the farm's nodes against LTX2Pipeline over the same loaded
    components (its default CFG + STG + modality guidance; the prompts encoded in separate
    calls: equal within float rounding). Its progress events carry the clip's frames, the first
    a live preview: the middle latent frame's x0 estimate through a latent → RGB fit, at the
    latent grid (1/32 side with LTX-2's VAE, 1/2 with the tiny one)
    (the preview changes nothing: the frames are still the pipeline's)."""
    import io

    from diffusers import LTX2Pipeline
    from PIL import Image

    from workers.models.ltx2.plugin import components_of, sequence_length

    models_dir, name = ltx2_stack
    recorder = PreviewRecorder()
    ctx = make_ctx(recorder, models_dir=models_dir)
    video = render(ctx, name)
    assert recorder.progress[-1] == (STEPS, STEPS) and set(recorder.frames) == {FRAMES}
    preview = recorder.previews[0]  # the first step's (INLINE_PREVIEW_SECONDS: at most 1 a second)
    assert preview is not None and recorder.previews[-1] is None  # none with the last step
    ratio = components_of(run(ctx, "load/checkpoint", {"file": name})["model"].transformer)[
        "vae"].spatial_compression_ratio
    assert Image.open(io.BytesIO(preview)).size == (W // ratio, H // ratio)
    components = components_of(run(ctx, "load/checkpoint", {"file": name})["model"].transformer)
    pipe: Any = LTX2Pipeline(**components)
    pipe.set_progress_bar_config(disable=True)
    out = pipe(prompt=PROMPT, negative_prompt="", generator=torch.Generator().manual_seed(5),
               num_inference_steps=STEPS, height=H, width=W, num_frames=FRAMES, frame_rate=FPS,
               max_sequence_length=sequence_length(components), output_type="np",
               spatio_temporal_guidance_blocks=[1])
    frames = (out.frames[0] * 255).round().astype(np.uint8)
    assert video.frames.array.shape == frames.shape == (FRAMES, H, W, 3)
    assert np.abs(video.frames.array.astype(int) - frames).max() <= 1
    np.testing.assert_allclose(video.audio.samples, out.audio[0].float().numpy(), atol=1e-4)
    assert video.fps == FPS
    assert video.audio.sample_rate == 16000
    # the clip's length in sound: the vocoder's mel frames (samples ÷ its upsampling) × the
    # audio VAE's hop (the tiny vocoder upsamples 4×, a full one by the hop, 160×)
    vocoder, audio_vae = components["vocoder"], components["audio_vae"]
    mel_frames = video.audio.samples.shape[-1] / np.prod(vocoder.config.upsample_factors)
    seconds = mel_frames * audio_vae.config.mel_hop_length / audio_vae.config.sample_rate
    assert seconds == pytest.approx(FRAMES / FPS, abs=4 * 160 / 16000)


def test_concurrent_runs_share_forwards_and_equal_their_solo_renders(ltx2_stack, make_ctx):
    models_dir, name = ltx2_stack
    prompts = [PROMPT, "a cat on a piano", "rain on a window"]
    solo = [render(make_ctx(models_dir=models_dir), name, p, seed=i) for i, p in enumerate(prompts)]
    recorders = [Recorder() for _ in prompts]
    videos: list[Any] = [None] * len(prompts)

    def one(i: int) -> None:
        videos[i] = render(make_ctx(recorders[i], models_dir), name, prompts[i], seed=i)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(b or 0 for r in recorders for b in r.batches) > 1
    for alone, together in zip(solo, videos, strict=True):
        assert np.abs(alone.frames.array.astype(int) - together.frames.array).max() <= 1
        np.testing.assert_allclose(alone.audio.samples, together.audio.samples, atol=1e-4)


def test_image_to_video_holds_the_first_frame(ltx2_stack, make_ctx):
    from diffusers import LTX2ImageToVideoPipeline
    from PIL import Image

    from workers.models.ltx2.plugin import components_of, sequence_length

    models_dir, name = ltx2_stack
    ctx = make_ctx(models_dir=models_dir)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (48, 40, 3), dtype=np.uint8))
    video = render(ctx, name, image=image)
    components = components_of(run(ctx, "load/checkpoint", {"file": name})["model"].transformer)
    pipe: Any = LTX2ImageToVideoPipeline(**components)
    pipe.set_progress_bar_config(disable=True)
    out = pipe(image=image, prompt=PROMPT, negative_prompt="",
               generator=torch.Generator().manual_seed(5), num_inference_steps=STEPS, height=H,
               width=W, num_frames=FRAMES, frame_rate=FPS,
               max_sequence_length=sequence_length(components), output_type="np",
               spatio_temporal_guidance_blocks=[1])
    frames = (out.frames[0] * 255).round().astype(np.uint8)
    assert np.abs(video.frames.array.astype(int) - frames).max() <= 1


def test_sigmas_written_by_hand_are_ltx2_pipeline_s_given_the_same(ltx2_stack, make_ctx):
    """ComfyUI's ManualSigmas (the LTX-2.3 distilled schedule, ending at 0) into ltx2/sample:
    one step per interval, the frames and sound LTX2Pipeline makes given the same `sigmas`
    (its list without the last 0) over an unshifted scheduler (the tiny stack's), and not the
    render of the pipeline's own schedule."""
    from diffusers import LTX2Pipeline

    from workers.models.ltx2.plugin import components_of, sequence_length

    models_dir, name = ltx2_stack
    values = [1.0, 0.99375, 0.9875, 0.909375, 0.725, 0.421875, 0.0]
    recorder = Recorder()
    ctx = make_ctx(recorder, models_dir=models_dir)
    video = render(ctx, name, sigmas=", ".join(map(str, values)))
    assert recorder.progress[-1] == (len(values) - 1, len(values) - 1)
    components = components_of(run(ctx, "load/checkpoint", {"file": name})["model"].transformer)
    assert not components["scheduler"].config.use_dynamic_shifting
    pipe: Any = LTX2Pipeline(**components)
    pipe.set_progress_bar_config(disable=True)
    out = pipe(prompt=PROMPT, negative_prompt="", generator=torch.Generator().manual_seed(5),
               sigmas=values[:-1], height=H, width=W, num_frames=FRAMES, frame_rate=FPS,
               max_sequence_length=sequence_length(components), output_type="np",
               spatio_temporal_guidance_blocks=[1])
    frames = (out.frames[0] * 255).round().astype(np.uint8)
    assert np.abs(video.frames.array.astype(int) - frames).max() <= 1
    np.testing.assert_allclose(video.audio.samples, out.audio[0].float().numpy(), atol=1e-4)
    own = render(make_ctx(models_dir=models_dir), name)
    assert np.abs(own.frames.array.astype(int) - frames).max() > 1


def test_a_lora_render_is_what_ltx2_pipeline_makes_with_the_lora_loaded(ltx2_stack, make_ctx):
    """A LoRA in ComfyUI's keys (video, audio and cross-modal layers) at strength 0.8: the
    frames and sound of LTX2Pipeline with it loaded (load_lora_weights, set_adapters), not the
    plain render's; the file is recognised as an LTX-2 LoRA."""
    from diffusers import LTX2Pipeline

    from workers.models.ltx2.plugin import sequence_length
    from workers.models.ltx2.tiny import build_tiny_components, write_tiny_lora

    models_dir, name = ltx2_stack
    lora = write_tiny_lora(models_dir)
    assert [(e["family"], e["role"]) for e in scan(models_dir) if e["name"] == lora] == [
        ("ltx2", "lora")]
    ctx = make_ctx(models_dir=models_dir)
    video = render(ctx, name, lora=(lora, 0.8))
    components = build_tiny_components()  # the stack's weights, fresh: PEFT changes modules
    pipe: Any = LTX2Pipeline(**components)
    pipe.set_progress_bar_config(disable=True)
    pipe.load_lora_weights(str(models_dir / "loras" / lora), adapter_name="a")
    pipe.set_adapters(["a"], adapter_weights=[0.8])
    out = pipe(prompt=PROMPT, negative_prompt="", generator=torch.Generator().manual_seed(5),
               num_inference_steps=STEPS, height=H, width=W, num_frames=FRAMES, frame_rate=FPS,
               max_sequence_length=sequence_length(components), output_type="np",
               spatio_temporal_guidance_blocks=[1])
    frames = (out.frames[0] * 255).round().astype(np.uint8)
    assert np.abs(video.frames.array.astype(int) - frames).max() <= 1
    np.testing.assert_allclose(video.audio.samples, out.audio[0].float().numpy(), atol=1e-4)
    plain = render(make_ctx(models_dir=models_dir), name)
    assert np.abs(plain.frames.array.astype(int) - frames).max() > 1


def test_a_first_frame_below_strength_1_denoises_toward_the_image(ltx2_stack, make_ctx):
    """ComfyUI's LTXVImgToVideoInplace strength (its noise mask 1 − strength on the first
    frame): at 0 the image is ignored — the text-to-video clip exactly; between 0 and 1 the
    first frame is neither that nor the held image's (strength 1, LTX2ImageToVideoPipeline's:
    test_image_to_video_holds_the_first_frame) and lies nearer the image than the text-to-video
    frame does."""
    from PIL import Image

    models_dir, name = ltx2_stack
    ctx = make_ctx(models_dir=models_dir)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (48, 40, 3), dtype=np.uint8))
    alone = render(ctx, name)
    ignored = render(ctx, name, image=image, strength=0.0)
    assert np.array_equal(ignored.frames.array, alone.frames.array)
    assert np.array_equal(ignored.audio.samples, alone.audio.samples)
    held, half = (render(ctx, name, image=image, strength=s) for s in (1.0, 0.7))
    first = [v.frames.array[0].astype(int) for v in (alone, half, held)]
    assert np.abs(first[1] - first[0]).max() > 1 and np.abs(first[1] - first[2]).max() > 1
    assert np.abs(first[1] - first[2]).mean() < np.abs(first[0] - first[2]).mean()


def test_clear_errors_name_what_is_wrong(ltx2_stack, make_ctx):
    from workers.runners.base import NodeFailed

    models_dir, name = ltx2_stack
    ctx = make_ctx(models_dir=models_dir)
    with pytest.raises(NodeFailed, match="at least 1 frame"):
        run(ctx, "ltx2/empty-latent", {"width": W, "height": H, "length": 0, "fps": FPS})
    # ComfyUI's length of 5 s at 25 fps + 1: the 8k + 1 frames below it
    assert run(ctx, "ltx2/empty-latent", {"width": W, "height": H, "length": 126, "fps": 1.0},
               {"fps": 25})["latent"].frames == 121
    parts = run(ctx, "load/checkpoint", {"file": name})
    positive = run(ctx, "encode/text", {"text": PROMPT}, {"encoder": parts["encoder"]})
    latent = run(ctx, "ltx2/empty-latent", {"width": W, "height": H, "length": FRAMES,
                                            "fps": FPS})["latent"]
    with pytest.raises(NodeFailed, match="blocks 0–1"):
        run(ctx, "ltx2/sample", {"seed": 1, "steps": 1, **GUIDANCE, "stg_blocks": "28"},
            {"model": parts["model"], "positive": positive["conditioning"], "latent": latent})
    for sigmas, match in (("0.9, 0.5, 0", "must run from 1"), ("1, 0.5, 0.5, 0", "must fall"),
                          ("1", "no step")):
        wired = run(ctx, "sampling/manual-sigmas", {"sigmas": sigmas})
        with pytest.raises(NodeFailed, match=match):
            run(ctx, "ltx2/sample", {"seed": 1, "steps": 1, **GUIDANCE},
                {"model": parts["model"], "positive": positive["conditioning"],
                 "latent": latent, **wired})
    with pytest.raises(NodeFailed, match="ltx2/sample"):
        run(ctx, "sample", {"seed": 1, "steps": 1, "guidance": 0.0, "denoise": 1.0},
            {"model": parts["model"], "positive": positive["conditioning"], "latent": latent})
    with pytest.raises(NodeFailed, match="sample it first"):
        run(ctx, "ltx2/decode", {}, {"vae": parts["vae"], "latent": latent})
