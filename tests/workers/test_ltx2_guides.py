"""LTX-2 keyframe guides (ltx2/add-guide, ComfyUI's LTXVAddGuide): a clip guided at its first
and last frames (and one in the middle) through the farm's nodes is the clip diffusers'
LTX2ConditionPipeline makes with the same conditions, the guides' tokens cropped off after
sampling; guided clips share the step batcher with their own kind and run apart from
others; images of another size are cut and scaled as ComfyUI does; bad frames are clear
errors."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from tests.workers.conftest import Recorder
from workers.runners import RUNNERS

W, H, FRAMES, FPS, STEPS = 32, 32, 9, 25.0, 3
PROMPT = "a paper boat drifting down a gutter"
GUIDANCE = {"cfg": 3.0, "stg": 1.0, "modality": 3.0, "rescale": 0.7, "audio_cfg": 7.0,
            "audio_stg": 1.0, "audio_modality": 3.0, "audio_rescale": 0.7,
            "stg_blocks": "1"}  # LTX2ConditionPipeline's defaults; its block 28 → the tiny one's 1
# The tiny VAE packs 2 frames per latent frame after the first (LTX-2's: 8): 9 frames are 5
# latent frames, and the pipeline's latent index k is pixel frame 2(k − 1) + 1.
LAST, MIDDLE = 7, 3  # latent indices 4 (the pipeline's -1) and 2


@pytest.fixture(scope="module")
def ltx2_stack(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    from workers.models.ltx2.plugin import write_tiny_stack

    models_dir = tmp_path_factory.mktemp("ltx2-guides")
    return models_dir, write_tiny_stack(models_dir)["checkpoint"]


def run(ctx: Any, node_type: str, params: dict[str, Any], inputs: dict[str, Any] | None = None) -> Any:
    return RUNNERS[node_type](ctx, params, inputs or {})


def picture(seed: int, width: int = 64, height: int = 64) -> Image.Image:
    """A random RGB image (64² by default: twice the clip's side, so the pipeline's resize
    and ComfyUI's are the same bilinear halving)."""
    pixels = np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def guided(ctx: Any, name: str, guides: list[tuple[Image.Image, int, float]], seed: int = 5,
           prompt: str = PROMPT) -> Any:
    """A clip of checkpoint `name` with (image, frame_idx, strength) guides, decoded."""
    parts = run(ctx, "load/checkpoint", {"file": name})
    positive = run(ctx, "encode/text", {"text": prompt}, {"encoder": parts["encoder"]})[
        "conditioning"]
    negative = run(ctx, "encode/text", {"text": ""}, {"encoder": parts["encoder"]})[
        "conditioning"]
    latent = run(ctx, "ltx2/empty-latent", {"width": W, "height": H, "length": FRAMES,
                                            "fps": FPS})["latent"]
    for image, frame, strength in guides:
        out = run(ctx, "ltx2/add-guide", {"frame_idx": frame, "strength": strength, "crf": -1},
                  {"positive": positive, "negative": negative, "vae": parts["vae"],
                   "latent": latent, "image": image})
        positive, negative, latent = out["positive"], out["negative"], out["latent"]
    sampled = run(ctx, "ltx2/sample", {"seed": seed, "steps": STEPS, **GUIDANCE},
                  {"model": parts["model"], "positive": positive, "negative": negative,
                   "latent": latent})["latent"]
    assert sampled.samples.shape[2] == 5  # the clip's latent frames: the guides' cropped off
    return run(ctx, "ltx2/decode", {}, {"vae": parts["vae"], "latent": sampled})["video"]


def pipeline_clip(ctx: Any, name: str, conditions: list[tuple[Image.Image, int, float]]) -> Any:
    """LTX2ConditionPipeline's clip over the checkpoint's loaded components, with
    (image, latent index, strength) conditions at the model's default CRF."""
    from diffusers.pipelines.ltx2.pipeline_ltx2_condition import (
        LTX2ConditionPipeline,
        LTX2VideoCondition,
    )

    from workers.models.ltx2.plugin import components_of, sequence_length

    components = components_of(run(ctx, "load/checkpoint", {"file": name})["model"].transformer)
    pipe: Any = LTX2ConditionPipeline(**components)
    pipe.set_progress_bar_config(disable=True)
    return pipe(conditions=[LTX2VideoCondition(frames=image, index=index, strength=strength)
                            for image, index, strength in conditions],
                prompt=PROMPT, negative_prompt="", generator=torch.Generator().manual_seed(5),
                num_inference_steps=STEPS, height=H, width=W, num_frames=FRAMES, frame_rate=FPS,
                max_sequence_length=sequence_length(components), output_type="np",
                spatio_temporal_guidance_blocks=[1])


def same_clip(video: Any, out: Any) -> None:
    frames = (out.frames[0] * 255).round().astype(np.uint8)
    assert video.frames.array.shape == frames.shape == (FRAMES, H, W, 3)
    assert np.abs(video.frames.array.astype(int) - frames).max() <= 1
    np.testing.assert_allclose(video.audio.samples, out.audio[0].float().numpy(), atol=1e-4)


@pytest.mark.parametrize("strength", [1.0, 0.7])
def test_first_and_last_frame_guides_are_ltx2_condition_pipeline_s(ltx2_stack, make_ctx,
                                                                   strength):
    """The first frame in place, the last appended (the pipeline's index -1 at frame 7 here),
    at strength 1 (held) and at the shipped flf2v templates' 0.7: LTX2ConditionPipeline's
    frames and sound."""
    models_dir, name = ltx2_stack
    ctx = make_ctx(models_dir=models_dir)
    first, last = picture(1), picture(2)
    video = guided(ctx, name, [(first, 0, strength), (last, LAST, strength)])
    same_clip(video, pipeline_clip(ctx, name, [(first, 0, strength), (last, -1, strength)]))
    unguided = (pipeline_clip(ctx, name, []).frames[0] * 255).round().astype(int)
    assert np.abs(video.frames.array.astype(int) - unguided).max() > 1


def test_a_guide_in_the_middle_too(ltx2_stack, make_ctx):
    models_dir, name = ltx2_stack
    ctx = make_ctx(models_dir=models_dir)
    images = [picture(1), picture(3), picture(2)]
    video = guided(ctx, name, [(images[0], 0, 1.0), (images[1], MIDDLE, 0.8),
                               (images[2], LAST, 1.0)])
    same_clip(video, pipeline_clip(ctx, name, [(images[0], 0, 1.0), (images[1], 2, 0.8),
                                               (images[2], 4, 1.0)]))


def test_negative_frames_count_from_the_end_as_comfyui_does(ltx2_stack, make_ctx):
    """frame_idx -1 is the clip's last frame (8 of 0–8), -2 the one before: ComfyUI's
    LTXVAddGuide; -2 is frame 7, the pipeline's last latent index."""
    from workers.models.ltx2.nodes import Guide

    models_dir, name = ltx2_stack
    ctx = make_ctx(models_dir=models_dir)
    parts = run(ctx, "load/checkpoint", {"file": name})
    positive = run(ctx, "encode/text", {"text": PROMPT}, {"encoder": parts["encoder"]})[
        "conditioning"]
    latent = run(ctx, "ltx2/empty-latent", {"width": W, "height": H, "length": FRAMES,
                                            "fps": FPS})["latent"]
    frames = []
    for frame_idx in (-1, -2, -FRAMES, 0, 4):
        out = run(ctx, "ltx2/add-guide", {"frame_idx": frame_idx, "strength": 1.0, "crf": 0},
                  {"positive": positive, "vae": parts["vae"], "latent": latent,
                   "image": picture(4)})
        assert out["positive"] is positive and out["negative"] is None
        [guide] = out["latent"].guides
        assert isinstance(guide, Guide)
        frames.append(guide.frame)
    assert frames == [8, 7, 0, 0, 4]
    # -2 and 7 are the same guide: the pipeline's index -1; -1 (frame 8) is not
    pipeline = pipeline_clip(ctx, name, [(picture(1), 0, 1.0), (picture(2), -1, 1.0)])
    same_clip(guided(ctx, name, [(picture(1), 0, 1.0), (picture(2), -2, 1.0)]), pipeline)
    last = guided(ctx, name, [(picture(1), 0, 1.0), (picture(2), -1, 1.0)])
    assert np.abs(last.frames.array.astype(int) - pipeline.frames[0] * 255).max() > 1


def test_a_frame_0_guide_replaces_the_image_to_video_first_frame(ltx2_stack, make_ctx):
    """One condition per frame 0 (as the pipeline writes it in place): a frame-0 guide drops
    ltx2/image-to-video's image, and image-to-video after it drops the guide."""
    models_dir, name = ltx2_stack
    ctx = make_ctx(models_dir=models_dir)
    parts = run(ctx, "load/checkpoint", {"file": name})
    positive = run(ctx, "encode/text", {"text": PROMPT}, {"encoder": parts["encoder"]})[
        "conditioning"]
    latent = run(ctx, "ltx2/empty-latent", {"width": W, "height": H, "length": FRAMES,
                                            "fps": FPS})["latent"]
    i2v = run(ctx, "ltx2/image-to-video", {"crf": 0, "strength": 1.0},
              {"vae": parts["vae"], "image": picture(1), "latent": latent})["latent"]
    base = {"positive": positive, "vae": parts["vae"], "image": picture(2)}
    both = run(ctx, "ltx2/add-guide", {"frame_idx": 0, "strength": 1.0, "crf": 0},
               {**base, "latent": i2v})["latent"]
    assert both.first is None and [g.frame for g in both.guides] == [0]
    last = run(ctx, "ltx2/add-guide", {"frame_idx": -1, "strength": 1.0, "crf": 0},
               {**base, "latent": i2v})["latent"]
    assert last.first is not None and [g.frame for g in last.guides] == [8]
    again = run(ctx, "ltx2/image-to-video", {"crf": 0, "strength": 1.0},
                {"vae": parts["vae"], "image": picture(1), "latent": both})["latent"]
    assert again.first is not None and again.guides == ()


def test_an_image_of_another_aspect_is_cut_at_its_centre_and_scaled(ltx2_stack, make_ctx):
    """ComfyUI's common_upscale(bilinear, center): a 96×64 image loses 16 columns each side,
    then is scaled to the clip's 32×32: the same latents as that square given as it is."""
    from workers.models.ltx2.engine import encode_guide
    from workers.models.ltx2.plugin import components_of

    models_dir, name = ltx2_stack
    ctx = make_ctx(models_dir=models_dir)
    components = components_of(run(ctx, "load/checkpoint", {"file": name})["model"].transformer)
    wide = picture(6, 96, 64)
    square = wide.crop((16, 0, 80, 64))
    encoded = [encode_guide(components, image, W, H, 0) for image in (wide, square)]
    assert encoded[0].shape == (1, 4, 1, H // 2, W // 2)
    assert torch.equal(encoded[0], encoded[1])


def test_guided_runs_share_forwards_with_their_kind_and_equal_their_solo_renders(
        ltx2_stack, make_ctx):
    """Two clips guided at the same frames share every forward (progress says 2); a plain
    clip of the same size runs apart from them (its tokens' positions differ), and each
    clip is what it is alone."""
    models_dir, name = ltx2_stack
    jobs: list[tuple[str, list[tuple[Image.Image, int, float]]]] = [
        (PROMPT, [(picture(1), 0, 1.0), (picture(2), LAST, 0.7)]),
        ("rain on a window", [(picture(3), 0, 0.7), (picture(4), LAST, 1.0)]),
        ("a cat on a piano", []),
    ]
    solo = [guided(make_ctx(models_dir=models_dir), name, g, seed=i, prompt=p)
            for i, (p, g) in enumerate(jobs)]
    recorders = [Recorder() for _ in jobs]
    videos: list[Any] = [None] * len(jobs)

    def one(i: int) -> None:
        prompt, guides = jobs[i]
        videos[i] = guided(make_ctx(recorders[i], models_dir), name, guides, seed=i,
                           prompt=prompt)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(recorders[0].batches + recorders[1].batches) == 2
    assert set(recorders[2].batches) == {1}
    for alone, together in zip(solo, videos, strict=True):
        assert np.abs(alone.frames.array.astype(int) - together.frames.array).max() <= 1
        np.testing.assert_allclose(alone.audio.samples, together.audio.samples, atol=1e-4)


def test_bad_guides_are_clear_errors(ltx2_stack, make_ctx):
    from workers.runners.base import NodeFailed

    models_dir, name = ltx2_stack
    ctx = make_ctx(models_dir=models_dir)
    parts = run(ctx, "load/checkpoint", {"file": name})
    positive = run(ctx, "encode/text", {"text": PROMPT}, {"encoder": parts["encoder"]})[
        "conditioning"]
    latent = run(ctx, "ltx2/empty-latent", {"width": W, "height": H, "length": FRAMES,
                                            "fps": FPS})["latent"]
    inputs = {"positive": positive, "vae": parts["vae"], "latent": latent, "image": picture(1)}
    for frame_idx in (FRAMES, 40, -FRAMES - 1):
        with pytest.raises(NodeFailed, match=f"frame_idx {frame_idx} is outside the clip's 9 "
                                             "frames"):
            run(ctx, "ltx2/add-guide", {"frame_idx": frame_idx, "strength": 1.0, "crf": 0},
                inputs)
    with pytest.raises(NodeFailed, match="strength must be between 0 and 1"):
        run(ctx, "ltx2/add-guide", {"frame_idx": 0, "strength": 1.5, "crf": 0}, inputs)
    with pytest.raises(NodeFailed, match="input 'latent' must be an LTX-2 latent"):
        run(ctx, "ltx2/add-guide", {"frame_idx": 0, "strength": 1.0, "crf": 0},
            {**inputs, "latent": None})


def test_a_sampled_clip_takes_guides_again_and_is_refined_over_wired_sigmas(ltx2_stack,
                                                                            make_ctx):
    """A second stage (ComfyUI's two-stage workflows condition the refined clip again): the
    sampled clip with a last-frame guide, refined from σ 0.9, keeps its length and is not the
    refine without the guide."""
    models_dir, name = ltx2_stack
    ctx = make_ctx(models_dir=models_dir)
    parts = run(ctx, "load/checkpoint", {"file": name})
    positive = run(ctx, "encode/text", {"text": PROMPT}, {"encoder": parts["encoder"]})[
        "conditioning"]
    latent = run(ctx, "ltx2/empty-latent", {"width": W, "height": H, "length": FRAMES,
                                            "fps": FPS})["latent"]
    common = {"model": parts["model"], "positive": positive}
    sampled = run(ctx, "ltx2/sample", {"seed": 1, "steps": 2, **GUIDANCE},
                  {**common, "latent": latent})["latent"]
    sigmas = run(ctx, "sampling/manual-sigmas", {"sigmas": "0.9, 0.5, 0"})["sigmas"]
    again = run(ctx, "ltx2/add-guide", {"frame_idx": -1, "strength": 1.0, "crf": 0},
                {"positive": positive, "vae": parts["vae"], "latent": sampled,
                 "image": picture(5)})["latent"]
    refined = [run(ctx, "ltx2/sample", {"seed": 2, "steps": 2, **GUIDANCE},
                   {**common, "latent": clip, "sigmas": sigmas})["latent"]
               for clip in (again, sampled)]
    assert refined[0].samples.shape == refined[1].samples.shape == sampled.samples.shape
    assert not torch.allclose(refined[0].samples, refined[1].samples)
