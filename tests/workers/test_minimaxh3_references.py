"""MiniMax-H3 reference-to-video (ref2va with image references): the farm's engine against
diffusers' MiniMaxH3ModularPipeline on the tiny stack and its ref2va transformer partition
(frames and the stereo waveform, exactly), and bad references named."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from workers.models.minimaxh3 import engine, loading, tiny

W, H, FRAMES, STEPS = 64, 32, 124, 3
PROMPT = "<Picture 1> waves at <Picture 2>"


def picture(seed: int, width: int, height: int) -> Image.Image:
    pixels = np.random.default_rng(seed).random((height, width, 3)) * 255
    return Image.fromarray(pixels.astype("uint8"))


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> engine.Parts:
    folder = tiny.write_folder(tmp_path_factory.mktemp("minimaxh3-r2v") / "smoke-minimaxh3")
    return dataclasses.replace(loading.load_folder(folder), transformer=tiny.reference_transformer())


@pytest.fixture(scope="module")
def reference() -> Any:
    pipe = tiny.smoke_pipeline()
    # the released 2048-pixel short edge is far too big for the tiny stack; at 32 the pipeline
    # sizes these references as ComfyUI's "match" does on a 64×32 canvas
    pipe.register_to_config(reference_image_short_edge=32)
    return pipe


def render(parts: engine.Parts, images: list[Image.Image], seed: int = 7) -> engine.Clip:
    request = engine.prepare_references(parts, PROMPT, width=W, height=H, frames=FRAMES,
                                        images=images, mode="match")
    run = engine.begin(parts, request, steps=STEPS, generator=torch.Generator("cpu").manual_seed(seed))
    while not run.done:
        engine.advance(run, engine.forward(parts.transformer, run))
    return engine.decode(parts, run.size, run.video[run.held:], run.audio)


def test_image_references_to_video_and_audio_are_the_modular_pipeline_s_bit_for_bit(parts,
                                                                                    reference):
    from diffusers.modular_pipelines.minimax_h3 import MiniMaxH3ImageReference

    # one already at its size (32×64), one scaled down onto it (96×48 → 64×32, Lanczos)
    images = [picture(0, 32, 64), picture(1, 96, 48)]
    state = reference(prompt=PROMPT, generator=torch.Generator("cpu").manual_seed(7),
                      references=[MiniMaxH3ImageReference(image=image) for image in images],
                      num_inference_steps=STEPS, height=H, width=W, num_frames=FRAMES,
                      output_type="pt")
    clip = render(parts, images)
    assert state.get("num_condition_video_rows") == 2 * 2  # two 2-patch blocks
    assert clip.frames.shape == (FRAMES, 3, H, W)
    assert torch.equal(clip.frames, state.get("videos")[0])
    assert torch.equal(clip.audio, state.get("audio")[0])


def test_the_references_steer_the_clip(parts):
    one = render(parts, [picture(0, 32, 64)])
    other = render(parts, [picture(2, 32, 64)])
    assert not torch.equal(one.frames, other.frames)


@pytest.mark.parametrize(("images", "mode", "message"), [
    ([], "match", "at least one reference image"),
    ([picture(0, 32, 32)] * 10, "match", "at most 9 reference images, got 10"),
    ([picture(0, 32, 32), picture(1, 160, 32)], "match", "reference image 2 must be within 1:4"),
    ([picture(0, 32, 32)], "huge", "mode must be one of match, max"),
])
def test_bad_references_are_named(parts, images, mode, message):
    with pytest.raises(ValueError, match=message):
        engine.prepare_references(parts, PROMPT, width=W, height=H, frames=FRAMES, images=images,
                                  mode=mode)


def test_max_scales_down_to_a_2048_short_edge_and_never_up():
    assert engine.reference_size(picture(0, 32, 64), 64, 32, "max", 32) == (32, 64)
    big = Image.new("RGB", (4096, 3072))
    assert engine.reference_size(big, 64, 32, "max", 32) == (2720, 2048)
    assert engine.reference_size(big, 64, 32, "match", 32) == (64, 32)
