"""LTX-2 from ComfyUI's separate files (diffusion_models/, vae/ twice, text_encoders/, each with
its <stem>.diffusers/ configs; the LTX-2.5 templates' loaders) through ltx2/load-files: each file
recognised from its keys, the weights they were written from, an LTX-2.5 clip equal to
LTX2Pipeline's over the loaded components, an LTX-2.3 clip equal to the same weights' all-in-one
file's, and clear errors naming the folder where a config or the tokenizer is missing."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.workers.conftest import Recorder
from tests.workers.test_ltx2_nodes import FPS, FRAMES, GUIDANCE, PROMPT, STEPS, H, W, render, run
from workers.models.catalog import scan
from workers.models.family import ModelLoadError
from workers.models.ltx2.files import FOLDERS, ROLES


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """The tiny LTX-2.5 stack as ComfyUI's four files."""
    from workers.models.ltx2.tiny import write_tiny_files

    models_dir = tmp_path_factory.mktemp("ltx25-files")
    return models_dir, write_tiny_files(models_dir)


def _copy(files: tuple[Path, dict[str, str]], to: Path) -> dict[str, Path]:
    models_dir, names = files
    paths = {}
    for role in ROLES:
        name, folder = names[role], FOLDERS[role]
        (to / folder).mkdir(parents=True, exist_ok=True)
        shutil.copy(models_dir / folder / name, to / folder / name)
        stem = name.removesuffix(".safetensors")
        shutil.copytree(models_dir / folder / f"{stem}.diffusers", to / folder / f"{stem}.diffusers")
        paths[role] = to / folder / name
    return paths


def test_each_file_is_recognised_as_its_ltx2_part_and_configs_are_not_listed(files):
    models_dir, names = files
    listed = {(str(e["folder"]), str(e["name"])): (e["family"], e["role"])
              for e in scan(models_dir)}
    assert listed == {
        ("diffusion_models", names["diffusion_model"]): ("ltx2", "transformer"),
        ("vae", names["vae"]): ("ltx2", "vae"),
        ("vae", names["audio_vae"]): ("ltx2", "vae"),
        ("text_encoders", names["text_encoder"]): ("ltx2", "text_encoder"),
    }


def test_the_files_load_the_weights_they_were_written_from(files):
    from safetensors import safe_open

    from workers.models.ltx2.files import load_files
    from workers.models.ltx2.tiny import build_tiny_components

    models_dir, names = files
    paths = {role: models_dir / FOLDERS[role] / names[role] for role in ROLES}
    with safe_open(str(paths["text_encoder"]), "pt") as f:  # ComfyUI's Gemma "with proj"
        assert {"model.layers.0.self_attn.q_proj.weight",
                "text_embedding_projection.video_aggregate_embed.weight"} <= set(f.keys())
    loaded = load_files(paths)
    assert load_files(paths) is loaded
    want = build_tiny_components(ltx25=True)
    for name in ("transformer", "connectors", "vae", "audio_vae", "vocoder", "text_encoder"):
        mine, theirs = loaded[name].state_dict(), want[name].state_dict()
        assert mine.keys() == theirs.keys(), name
        assert all(torch.equal(mine[k], theirs[k]) for k in theirs), name
    assert type(loaded["text_encoder"]).__name__ == "Gemma4UnifiedForConditionalGeneration"
    assert loaded["tokenizer"]("a fox").input_ids == want["tokenizer"]("a fox").input_ids


def test_an_ltx2_5_clip_from_the_files_is_ltx2_pipeline_s(files, make_ctx):
    from diffusers import LTX2Pipeline

    from workers.models.ltx2.plugin import components_of, sequence_length

    models_dir, names = files
    ctx = make_ctx(Recorder(), models_dir=models_dir)
    video = render(ctx, "", seed=3, files=names)
    model = run(ctx, "ltx2/load-files", names)["model"]
    components = components_of(model.transformer)
    pipe: Any = LTX2Pipeline(**components)
    pipe.set_progress_bar_config(disable=True)
    out = pipe(prompt=PROMPT, negative_prompt="", generator=torch.Generator().manual_seed(3),
               num_inference_steps=STEPS, height=H, width=W, num_frames=FRAMES, frame_rate=FPS,
               max_sequence_length=sequence_length(components), output_type="np",
               guidance_scale=GUIDANCE["cfg"], stg_scale=GUIDANCE["stg"],
               modality_scale=GUIDANCE["modality"], guidance_rescale=GUIDANCE["rescale"],
               audio_guidance_scale=GUIDANCE["audio_cfg"], spatio_temporal_guidance_blocks=[1])
    frames = (out.frames[0] * 255).round().astype(np.uint8)
    assert np.abs(video.frames.array.astype(int) - frames).max() <= 1
    np.testing.assert_allclose(video.audio.samples, out.audio[0].float().numpy(), atol=1e-4)


def test_an_ltx2_3_clip_from_separate_files_is_the_all_in_one_file_s(tmp_path, make_ctx):
    from workers.models.ltx2.tiny import write_tiny_files, write_tiny_single_file

    whole = write_tiny_single_file(tmp_path, name="whole", ltx23=True)["checkpoint"]
    names = write_tiny_files(tmp_path, name="parts", ltx23=True, ltx25=False)
    ctx = make_ctx(Recorder(), models_dir=tmp_path)
    from_files, from_file = render(ctx, "", seed=9, files=names), render(ctx, whole, seed=9)
    assert np.array_equal(from_files.frames.array, from_file.frames.array)
    assert np.array_equal(from_files.audio.samples, from_file.audio.samples)


@pytest.mark.parametrize(("role", "part"), [("diffusion_model", "transformer"),
                                            ("audio_vae", "vocoder"),
                                            ("text_encoder", "tokenizer")])
def test_a_missing_config_names_the_folder_to_put_it_in(files, tmp_path, role, part):
    from workers.models.ltx2.files import load_files

    paths = _copy(files, tmp_path)
    configs = paths[role].with_name(paths[role].name.removesuffix(".safetensors") + ".diffusers")
    shutil.rmtree(configs / part)
    with pytest.raises(ModelLoadError) as err:
        load_files(paths)
    assert f"{part}/" in str(err.value) and f"{configs}/" in str(err.value)


def test_the_connectors_config_is_asked_for_beside_the_text_encoder(files, tmp_path):
    from workers.models.ltx2.files import load_files

    paths = _copy(files, tmp_path)
    configs = paths["text_encoder"].with_name(
        paths["text_encoder"].name.removesuffix(".safetensors") + ".diffusers")
    shutil.rmtree(configs / "connectors")
    with pytest.raises(ModelLoadError, match=r"put connectors/config\.json in"):
        load_files(paths)


def test_files_in_the_wrong_roles_are_refused_by_name(files, make_ctx):
    models_dir, names = files
    ctx = make_ctx(Recorder(), models_dir=models_dir)
    swapped = {**names, "vae": names["audio_vae"], "audio_vae": names["vae"]}
    from workers.runners import NodeFailed

    with pytest.raises(NodeFailed) as err:
        run(ctx, "ltx2/load-files", swapped)
    assert names["audio_vae"] in str(err.value)


def test_a_quantized_file_is_refused_as_such(files, tmp_path):
    """ComfyUI ships LTX-2.5 as int8 "convrot" files (weights + scales): refused by name, not
    read as plain weights."""
    from safetensors.torch import load_file, save_file

    from workers.models.ltx2.files import load_files

    paths = _copy(files, tmp_path)
    state = load_file(str(paths["diffusion_model"]))
    state["model.diffusion_model.proj_in.weight_scale"] = torch.ones(1)
    save_file(state, str(paths["diffusion_model"]))
    with pytest.raises(ModelLoadError) as err:
        load_files(paths)
    assert paths["diffusion_model"].name in str(err.value) and "quantized" in str(err.value)
