"""LTX-2 from ComfyUI's all-in-one file (checkpoints/<name>.safetensors in the original keys, its
configs in <name>.diffusers/): the key maps against diffusers' own converters, the file
recognised as an LTX-2 checkpoint, its components equal to the same weights' LTX2Pipeline
folder, a clip through load/checkpoint equal to the folder's, and clear errors naming the folder
where a config or the tokenizer is missing."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.workers.conftest import Recorder
from tests.workers.test_ltx2_nodes import render
from workers.models.catalog import scan
from workers.models.family import ModelLoadError


@pytest.fixture(scope="module")
def stacks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """The tiny stack twice in one models dir: as an LTX2Pipeline folder and as ComfyUI's file."""
    from workers.models.ltx2.tiny import write_tiny_single_file, write_tiny_stack

    models_dir = tmp_path_factory.mktemp("ltx2-file")
    folder = write_tiny_stack(models_dir)["checkpoint"]
    return models_dir, folder, write_tiny_single_file(models_dir)["checkpoint"]


def test_the_published_video_vae_s_original_keys_convert_as_diffusers_converts_them():
    """keys.vae_from_original reads any block count; on the published VAE (4 down / 3 up
    blocks: AutoencoderKLLTX2Video's defaults) it agrees with convert_ltx2_vae_to_diffusers."""
    from diffusers import AutoencoderKLLTX2Video
    from diffusers.loaders.single_file_utils import convert_ltx2_vae_to_diffusers

    from workers.models.ltx2 import keys

    with torch.device("meta"):
        vae: Any = AutoencoderKLLTX2Video()
    state = vae.state_dict()
    original = keys.vae_to_original(state)
    assert "encoder.down_blocks.8.res_blocks.0.conv1.conv.weight" in original  # the middle
    assert "decoder.up_blocks.1.conv.conv.weight" in original  # the first upsampler
    theirs = convert_ltx2_vae_to_diffusers({"vae." + k: v for k, v in original.items()})
    assert set(theirs) == set(keys.vae_from_original(original)) == set(state)


def test_the_tiny_file_s_keys_are_the_original_ones_diffusers_converts_back():
    from diffusers.loaders.single_file_utils import (
        convert_ltx2_audio_vae_to_diffusers,
        convert_ltx2_transformer_to_diffusers,
    )

    from workers.models.ltx2 import keys
    from workers.models.ltx2.tiny import build_tiny_components

    components = build_tiny_components()
    states = {c: components[c].state_dict() for c in keys.PREFIXES | {"transformer": "",
                                                                     "connectors": ""}}
    flat = keys.to_original(states)
    for key in ("model.diffusion_model.patchify_proj.weight",
                "model.diffusion_model.adaln_single.linear.weight",
                "model.diffusion_model.av_ca_a2v_gate_adaln_single.linear.weight",
                "model.diffusion_model.video_embeddings_connector.transformer_1d_blocks.0."
                "attn1.q_norm.weight",
                "text_embedding_projection.aggregate_embed.weight",
                "vae.per_channel_statistics.mean-of-means", "vocoder.conv_pre.weight"):
        assert key in flat, key
    # the transformer and audio VAE parts read back through diffusers' own converters
    dit = {k: v for k, v in flat.items() if k.startswith(keys.DIT)
           and not k.removeprefix(keys.DIT).startswith(keys.CONNECTORS)}
    assert set(convert_ltx2_transformer_to_diffusers(dit)) == set(states["transformer"])
    audio = {k: v for k, v in flat.items() if k.startswith("audio_vae.")}
    assert set(convert_ltx2_audio_vae_to_diffusers(audio)) == set(states["audio_vae"])
    back = keys.from_original(flat)
    assert not back.pop("unknown")
    for name, state in states.items():
        assert back[name].keys() == state.keys(), name
        assert all(torch.equal(back[name][k], state[k]) for k in state), name


def test_the_file_is_an_ltx2_checkpoint_and_its_configs_folder_is_not_listed(stacks):
    models_dir, folder, file = stacks
    listed = {(str(e["folder"]), str(e["name"])): (e["family"], e["role"])
              for e in scan(models_dir)}
    assert listed[("checkpoints", file)] == ("ltx2", "checkpoint")
    assert listed[("checkpoints", folder)] == ("ltx2", "checkpoint")
    assert not any(name.endswith(".diffusers") for _, name in listed)


def test_the_file_loads_the_same_weights_as_the_folder(stacks):
    from workers.models.ltx2.loading import load_folder, load_single_file

    models_dir, folder, file = stacks
    ours = load_single_file(models_dir / "checkpoints" / file)
    theirs = load_folder(models_dir / "checkpoints" / folder)
    for name, module in theirs.items():
        if not hasattr(module, "state_dict"):
            continue
        mine, want = ours[name].state_dict(), module.state_dict()
        assert mine.keys() == want.keys(), name
        assert all(torch.equal(mine[k], want[k]) for k in want), name
        assert _config(ours[name]) == _config(module), name
    assert ours["scheduler"].config == theirs["scheduler"].config
    assert ours["tokenizer"]("a fox").input_ids == theirs["tokenizer"]("a fox").input_ids


def _config(module: Any) -> dict[str, Any]:
    """A diffusers or transformers module's config, less where it was read from."""
    config = module.config
    config = dict(config.items()) if hasattr(config, "items") else config.to_dict()
    return {k: v for k, v in config.items() if k not in ("_name_or_path", "name_or_path")}


def test_a_clip_from_the_file_is_the_folder_s_clip(stacks, make_ctx):
    models_dir, folder, file = stacks
    ctx = make_ctx(Recorder(), models_dir=models_dir)
    from_file, from_folder = render(ctx, file, seed=9), render(ctx, folder, seed=9)
    assert np.array_equal(from_file.frames.array, from_folder.frames.array)
    assert np.array_equal(from_file.audio.samples, from_folder.audio.samples)
    assert from_file.audio.sample_rate == from_folder.audio.sample_rate


def _copy(stacks: tuple[Path, str, str], tmp_path: Path) -> Path:
    models_dir, _, file = stacks
    (tmp_path / "checkpoints").mkdir()
    stem = file.removesuffix(".safetensors")
    shutil.copy(models_dir / "checkpoints" / file, tmp_path / "checkpoints" / file)
    shutil.copytree(models_dir / "checkpoints" / f"{stem}.diffusers",
                    tmp_path / "checkpoints" / f"{stem}.diffusers")
    return tmp_path / "checkpoints" / file


def test_a_file_without_its_configs_names_the_folder_to_put_them_in(stacks, tmp_path):
    from workers.models.ltx2.loading import load_single_file

    path = _copy(stacks, tmp_path)
    configs = path.with_name(path.name.removesuffix(".safetensors") + ".diffusers")
    shutil.rmtree(configs / "vocoder")
    with pytest.raises(ModelLoadError) as err:
        load_single_file(path)
    assert str(configs) in str(err.value) and "vocoder" in str(err.value)


def test_a_missing_tokenizer_names_its_folder(stacks, tmp_path):
    from workers.models.ltx2.loading import load_single_file

    path = _copy(stacks, tmp_path)
    tokenizer = path.with_name(path.name.removesuffix(".safetensors") + ".diffusers") / "tokenizer"
    for entry in tokenizer.iterdir():
        entry.unlink()
    with pytest.raises(ModelLoadError) as err:
        load_single_file(path)
    assert f"{tokenizer}/" in str(err.value) and "tokenizer" in str(err.value)


def test_a_config_that_does_not_match_the_file_says_which_component(stacks, tmp_path):
    import json

    from workers.models.ltx2.loading import load_single_file

    path = _copy(stacks, tmp_path)
    config_file = (path.with_name(path.name.removesuffix(".safetensors") + ".diffusers")
                   / "vocoder" / "config.json")
    config: dict[str, Any] = json.loads(config_file.read_text())
    config["resnet_kernel_sizes"] = [3, 5]  # one more res block than the file holds
    config["resnet_dilations"] = [[1, 3, 5], [1, 3, 5]]
    config_file.write_text(json.dumps(config))
    with pytest.raises(ModelLoadError) as err:
        load_single_file(path)
    assert "(an LTX-2.0 file): its vocoder does not match" in str(err.value)
    assert ".diffusers/vocoder/config.json" in str(err.value)


def test_an_ltx2_3_file_loads_and_renders_as_ltx2_pipeline_over_its_components(tmp_path,
                                                                               make_ctx):
    """LTX-2.3's layout (attention gates, prompt AdaLN, a Gemma projection per modality) in
    the original keys, with its configs beside it: recognised, converted, and a clip through
    load/checkpoint is LTX2Pipeline's over the loaded components."""
    from diffusers import LTX2Pipeline
    from safetensors import safe_open

    from workers.models.ltx2.plugin import components_of, sequence_length
    from workers.models.ltx2.tiny import write_tiny_single_file
    from workers.runners import RUNNERS

    file = write_tiny_single_file(tmp_path, name="smoke-ltx23", ltx23=True)["checkpoint"]
    with safe_open(str(tmp_path / "checkpoints" / file), "pt") as f:
        names = set(f.keys())
    assert {"model.diffusion_model.prompt_adaln_single.linear.weight",
            "model.diffusion_model.audio_prompt_adaln_single.linear.weight",
            "model.diffusion_model.transformer_blocks.0.attn1.to_gate_logits.weight",
            "text_embedding_projection.video_aggregate_embed.weight",
            "text_embedding_projection.audio_aggregate_embed.weight"} <= names
    assert [e["role"] for e in scan(tmp_path) if e["name"] == file] == ["checkpoint"]
    ctx = make_ctx(Recorder(), models_dir=tmp_path)
    video = render(ctx, file, seed=3)
    model = RUNNERS["load/checkpoint"](ctx, {"file": file}, {})["model"]
    components = components_of(model.transformer)
    assert components["transformer"].config.gated_attn
    pipe: Any = LTX2Pipeline(**components)
    pipe.set_progress_bar_config(disable=True)
    out = pipe(prompt="a robot dancing", negative_prompt="",
               generator=torch.Generator().manual_seed(3), num_inference_steps=3, height=32,
               width=32, num_frames=9, frame_rate=25.0,
               max_sequence_length=sequence_length(components), output_type="np",
               spatio_temporal_guidance_blocks=[1])
    frames = (out.frames[0] * 255).round().astype(np.uint8)
    assert np.abs(video.frames.array.astype(int) - frames).max() <= 1
    np.testing.assert_allclose(video.audio.samples, out.audio[0].float().numpy(), atol=1e-4)


def test_an_ltx2_3_file_beside_ltx2_0_configs_says_which_it_is(tmp_path):
    from workers.models.ltx2.loading import load_single_file
    from workers.models.ltx2.tiny import write_tiny_single_file

    new = write_tiny_single_file(tmp_path, name="new", ltx23=True)["checkpoint"]
    write_tiny_single_file(tmp_path, name="old")
    folder = tmp_path / "checkpoints"
    shutil.rmtree(folder / "new.diffusers")
    shutil.copytree(folder / "old.diffusers", folder / "new.diffusers")
    with pytest.raises(ModelLoadError) as err:
        load_single_file(folder / new)
    assert "(an LTX-2.3 file): its transformer does not match" in str(err.value)
    assert "put that version's diffusers configs there" in str(err.value)


def test_the_file_s_identity_covers_its_configs_folder(stacks, tmp_path):
    """The Gemma 3 and every config live in <stem>.diffusers/: changing them is another model
    (lineage, caches), as changing the file is."""
    from workers.models.catalog import file_sha256
    from workers.models.ltx2.plugin import checkpoint_sha256

    path = _copy(stacks, tmp_path)
    before = checkpoint_sha256(path)
    assert before != file_sha256(path)
    tokenizer = path.with_name(path.name.removesuffix(".safetensors") + ".diffusers") / "tokenizer"
    config = next(tokenizer.glob("tokenizer_config.json"))
    config.write_text(config.read_text().replace("}", ', "note": "changed"}', 1))
    assert checkpoint_sha256(path) != before


def comfy_gemma(text_encoder: Any) -> dict[str, Any]:
    """A Gemma3ForConditionalGeneration's weights as ComfyUI's gemma_3_12B_it file keeps them:
    the text model only, under `model.` (`model.layers.N.…`, `model.embed_tokens`), and its
    SentencePiece tokenizer as a `spiece_model` byte tensor (here a stand-in)."""
    state = {k.replace("model.language_model.", "model."): v.contiguous()
             for k, v in text_encoder.state_dict().items() if k.startswith("model.language_model.")}
    return {**state, "spiece_model": torch.frombuffer(bytearray(b"\x0a\x00"), dtype=torch.uint8)}


def test_comfyui_s_text_only_gemma_file_linked_in_encodes_as_the_folder_s(stacks, tmp_path):
    from safetensors.torch import save_file

    from workers.models.ltx2.engine import encode_prompts
    from workers.models.ltx2.loading import load_folder, load_single_file

    models_dir, folder, _ = stacks
    path = _copy(stacks, tmp_path)
    gemma = path.with_name(path.name.removesuffix(".safetensors") + ".diffusers") / "text_encoder"
    theirs = load_folder(models_dir / "checkpoints" / folder)
    for weights in gemma.glob("*.safetensors"):
        weights.unlink()
    comfy = tmp_path / "gemma_3_12B_it.safetensors"  # as in ComfyUI's text_encoders/
    save_file(comfy_gemma(theirs["text_encoder"]), str(comfy))
    (gemma / "model.safetensors").symlink_to(comfy)
    ours = load_single_file(path)
    want = theirs["text_encoder"].model.language_model.state_dict()
    got = ours["text_encoder"].state_dict()  # the text model alone: all LTX-2 encodes with
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    texts = ["a paper lantern", "a kite over dunes"]
    for mine, reference in zip(encode_prompts(ours, texts, 32), encode_prompts(theirs, texts, 32),
                               strict=True):
        assert torch.equal(mine, reference)


def test_a_gemma_file_missing_text_weights_names_its_folder(stacks, tmp_path):
    """transformers would leave them random: the loader refuses instead."""
    from safetensors.torch import load_file, save_file

    from workers.models.ltx2.loading import load_single_file

    path = _copy(stacks, tmp_path)
    gemma = path.with_name(path.name.removesuffix(".safetensors") + ".diffusers") / "text_encoder"
    [weights] = gemma.glob("*.safetensors")
    state = {k: v for k, v in load_file(str(weights)).items() if ".layers.1." not in k}
    save_file(state, str(weights))
    with pytest.raises(ModelLoadError) as err:
        load_single_file(path)
    assert f"{gemma}/" in str(err.value) and "layers.1." in str(err.value)
