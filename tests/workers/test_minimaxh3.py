"""MiniMax-H3: the farm's engine against diffusers' MiniMaxH3ModularPipeline (t2va, and fl2va with
a first, a last or both keyframes) on a tiny random stack loaded from a diffusers folder (frames
and the stereo waveform, exactly), bad requests named, and file recognition of every part."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from workers.models.family import ModelLoadError
from workers.models.header import ModelHeader, read_header
from workers.models.minimaxh3 import FAMILY, engine, latent_frames, loading, tiny

W, H, FRAMES, STEPS = 64, 32, 124, 3  # 124 = 17·7 + 5: the shortest clip (5.17 s at 24 fps)
PROMPT = "a robot dancing"


def header(path: Path) -> ModelHeader:
    read = read_header(path)
    assert read is not None
    return read


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny.write_folder(tmp_path_factory.mktemp("minimaxh3") / "smoke-minimaxh3")


@pytest.fixture(scope="module")
def parts(folder: Path) -> engine.Parts:
    return loading.load_folder(folder)


@pytest.fixture(scope="module")
def reference() -> Any:
    return tiny.smoke_pipeline()


def test_text_to_video_and_audio_is_the_modular_pipeline_s_bit_for_bit(parts, reference):
    state = reference(prompt=PROMPT, generator=torch.Generator("cpu").manual_seed(7),
                      num_inference_steps=STEPS, height=H, width=W, num_frames=FRAMES,
                      output_type="pt")
    clip = engine.render(parts, PROMPT, width=W, height=H, frames=FRAMES, steps=STEPS,
                         generator=torch.Generator("cpu").manual_seed(7))
    assert clip.frames.shape == (FRAMES, 3, H, W)
    assert torch.equal(clip.frames, state.get("videos")[0])
    assert clip.audio.shape == (2, 207 * 4)  # 40 latents a second, the tiny VAE's hop of 4
    assert torch.equal(clip.audio, state.get("audio")[0])
    assert clip.sample_rate == state.get("sampling_rate") == 160
    assert latent_frames(FRAMES) == 37


def keyframe(seed: int, height: int, width: int) -> Image.Image:
    pixels = np.random.default_rng(seed).random((height, width, 3)) * 255
    return Image.fromarray(pixels.astype("uint8"))


@pytest.mark.parametrize("ends", [("image",), ("last_image",), ("image", "last_image")])
def test_keyframes_to_video_and_audio_are_the_modular_pipeline_s_bit_for_bit(parts, reference,
                                                                              ends):
    # off the canvas's aspect: the first is stretched onto it, a last after it cover-cropped
    images = {"image": keyframe(0, 48, 80), "last_image": keyframe(1, 40, 40)}
    given = {end: images[end] for end in ends}
    state = reference(prompt=PROMPT, generator=torch.Generator("cpu").manual_seed(7),
                      num_inference_steps=STEPS, height=H, width=W, num_frames=FRAMES,
                      output_type="pt", **given)
    clip = engine.render(parts, PROMPT, width=W, height=H, frames=FRAMES, steps=STEPS,
                         generator=torch.Generator("cpu").manual_seed(7),
                         first=given.get("image"), last=given.get("last_image"))
    assert state.get("num_condition_video_rows") == 2 * len(ends)  # a 2-patch row each
    assert torch.equal(clip.frames, state.get("videos")[0])
    assert torch.equal(clip.audio, state.get("audio")[0])


def test_a_keyframe_changes_the_clip(parts):
    def render(first: Image.Image | None) -> torch.Tensor:
        return engine.render(parts, PROMPT, width=32, height=32, frames=FRAMES, steps=2,
                             generator=torch.Generator("cpu").manual_seed(1), first=first).frames

    assert not torch.equal(render(None), render(keyframe(0, 32, 32)))


def test_runs_stepped_in_turn_are_the_runs_rendered_alone(parts):
    def kwargs(seed: int) -> dict[str, Any]:
        return {"width": 32, "height": 32, "frames": FRAMES, "steps": 3,
                "generator": torch.Generator("cpu").manual_seed(seed)}

    runs = [engine.start(parts, PROMPT, **kwargs(1)),
            engine.start(parts, "a cat", **kwargs(2), first=keyframe(0, 32, 32))]
    while not all(run.done for run in runs):
        for run in runs:  # as a step batcher interleaves its jobs
            engine.advance(run, engine.forward(parts.transformer, run))
    alone = [engine.render(parts, PROMPT, **kwargs(1)),
             engine.render(parts, "a cat", **kwargs(2), first=keyframe(0, 32, 32))]
    for run, clip in zip(runs, alone, strict=True):
        assert run.steps == 2
        stepped = engine.decode(parts, run.size, run.video[run.held:], run.audio)
        assert torch.equal(stepped.frames, clip.frames)
        assert torch.equal(stepped.audio, clip.audio)


def test_another_seed_or_prompt_makes_another_clip(parts):
    def render(prompt: str, seed: int) -> torch.Tensor:
        return engine.render(parts, prompt, width=32, height=32, frames=FRAMES, steps=2,
                             generator=torch.Generator("cpu").manual_seed(seed)).frames

    first = render(PROMPT, 1)
    assert torch.equal(first, render(PROMPT, 1))
    assert not torch.equal(first, render(PROMPT, 2))
    assert not torch.equal(first, render("a cat", 1))


@pytest.mark.parametrize(("size", "frames", "message"), [
    ((48, 32), FRAMES, "multiples of 32"),
    ((32, 32), 100, "rounded up to 107"),
    ((32, 32), 346, "rounded up to 362"),
])
def test_a_bad_request_is_named(parts, size, frames, message):
    with pytest.raises(ValueError, match=message):
        engine.render(parts, PROMPT, width=size[0], height=size[1], frames=frames, steps=2,
                      generator=torch.Generator("cpu").manual_seed(0))


def test_a_folder_without_a_part_is_refused_by_name(folder, tmp_path):
    (tmp_path / "half").mkdir()
    with pytest.raises(ModelLoadError, match="no transformer/"):
        loading.load_folder(tmp_path / "half")


@pytest.mark.parametrize(("part", "role"), [
    ("transformer", "transformer"), ("vae", "vae"), ("audio_vae", "vae"),
    ("text_encoder", "text_encoder"),
])
def test_every_part_of_the_stack_is_recognised(folder, part, role):
    file = next((folder / part).glob("*.safetensors"))
    assert FAMILY.recognise(header(file)) == role  # the weights alone
    assert FAMILY.recognise(header(folder / part)) == role  # the folder (its config)


def test_the_folder_is_recognised_as_a_checkpoint_with_its_processor(folder, parts):
    assert FAMILY.recognise(header(folder)) == "checkpoint"
    assert parts.processor.image_processor.patch_size == 16  # read back from tokenizer/


def test_comfyui_s_single_file_transformer_renders_the_pipeline_s_clip(folder, parts, reference,
                                                                      tmp_path):
    file = tiny.write_transformer_file(tmp_path / "smoke-minimaxh3.safetensors")
    assert FAMILY.recognise(header(file)) == "transformer"
    transformer = loading.load_transformer_file(file)
    for key, value in parts.transformer.state_dict().items():
        assert torch.equal(transformer.state_dict()[key], value), key
    state = reference(prompt=PROMPT, generator=torch.Generator("cpu").manual_seed(3),
                      num_inference_steps=STEPS, height=H, width=W, num_frames=FRAMES,
                      output_type="pt")
    clip = engine.render(dataclasses.replace(parts, transformer=transformer), PROMPT, width=W,
                         height=H, frames=FRAMES, steps=STEPS,
                         generator=torch.Generator("cpu").manual_seed(3))
    assert torch.equal(clip.frames, state.get("videos")[0])
    assert torch.equal(clip.audio, state.get("audio")[0])


@pytest.mark.parametrize(("extra", "message"), [
    ("blocks.0.attn.qkv_proj.weight_scale", "quantized weights"),  # ComfyUI's int8 "convrot"
    ("adaln_t_table", "pruned MiniMax-H3 transformer"),  # the shipped fl2va file
])
def test_comfyui_s_quantized_or_pruned_transformer_is_refused_by_name(tmp_path, extra, message):
    from safetensors.torch import load_file, save_file

    file = tiny.write_transformer_file(tmp_path / "shipped.safetensors")
    state = load_file(str(file))
    state["model.diffusion_model." + extra] = torch.ones(1)
    save_file(state, file)
    assert FAMILY.recognise(header(file)) == "transformer"  # known, then refused at load
    with pytest.raises(ModelLoadError, match=f"shipped.safetensors .*{message}"):
        loading.load_transformer_file(file)


def test_other_families_files_are_not_taken(smoke_stack):
    for file in (smoke_stack.models_dir / "diffusion_models").glob("*.safetensors"):
        assert FAMILY.recognise(header(file)) is None
    for file in (smoke_stack.models_dir / "vae").glob("*.safetensors"):
        assert FAMILY.recognise(header(file)) is None
