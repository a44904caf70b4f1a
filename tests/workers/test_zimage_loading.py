"""Loading Z-Image files from a models dir: both key layouts, folders, single-file encoders,
and clear errors for missing, corrupt or incomplete files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.workers.helpers import png_bytes
from workers.models.catalog import ModelFileMissing
from workers.models.zimage import engine, loading
from workers.models.zimage.loading import ModelLoadError
from workers.models.zimage.tiny import (
    SMOKE_NAME,
    VAE_CONFIG,
    build_tiny_components,
    to_original_flux_vae_keys,
)
from workers.runners import diffusion  # noqa: F401  (registers the runners)
from workers.runners.base import RUNNERS, NodeFailed

SMOKE_FILE = f"{SMOKE_NAME}.safetensors"


@pytest.fixture
def models_dir(smoke_stack, tmp_path) -> Path:
    """A writable copy of the smoke stack's models dir."""
    return Path(shutil.copytree(smoke_stack.models_dir, tmp_path / "models"))


def turbo(ctx, names, **overrides):
    params = {
        "prompt": "a lighthouse",
        "negative_prompt": "",
        "width": 32,
        "height": 32,
        "steps": 2,
        "guidance": 0.0,
        "seed": 1,
        "strength": 0.6,
        **names,
        **overrides,
    }
    return RUNNERS["zimage/turbo"](ctx, params, {})["image"]


def test_a_diffusers_layout_file_paints_the_same_image_as_the_comfyui_layout(
    smoke_stack, models_dir, make_ctx
):
    state = build_tiny_components()["transformer"].state_dict()
    folder = models_dir / "diffusion_models"
    save_file({k: v.contiguous() for k, v in state.items()}, folder / "diffusers.safetensors")
    shutil.copy(folder / f"{SMOKE_NAME}.config.json", folder / "diffusers.config.json")
    comfy = turbo(make_ctx(models_dir=models_dir), smoke_stack.names)
    other = turbo(make_ctx(models_dir=models_dir), {**smoke_stack.names, "model": "diffusers.safetensors"})
    assert png_bytes(comfy) == png_bytes(other)


def test_diffusers_folders_load_for_the_transformer_and_the_vae(models_dir, cpu_policy):
    parts = build_tiny_components()
    parts["transformer"].save_pretrained(models_dir / "diffusion_models" / "tiny-folder")
    parts["vae"].save_pretrained(models_dir / "vae" / "tiny-folder")
    model = loading.load_diffusion_model(models_dir, "tiny-folder", cpu_policy)
    vae = loading.load_vae(models_dir, "tiny-folder", cpu_policy)
    for ours, theirs in ((model.transformer, parts["transformer"]), (vae.module, parts["vae"])):
        expected = theirs.state_dict()
        assert all(torch.equal(v, expected[k]) for k, v in ours.state_dict().items())


@pytest.mark.parametrize(
    "geometry",
    [{}, {"block_out_channels": [32, 64, 64, 64], "layers_per_block": 2}],
    ids=["tiny", "with-shortcuts"],  # the second has Flux's nin_shortcut convs and 2/3 resnets
)
def test_an_original_flux_layout_vae_file_encodes_and_decodes_like_the_diffusers_layout(
    models_dir, cpu_policy, geometry
):
    from diffusers import AutoencoderKL

    config = {**VAE_CONFIG, **geometry}
    torch.manual_seed(0)
    reference: Any = AutoencoderKL(**config) if geometry else build_tiny_components()["vae"]
    reference.eval()
    state = {k: v.contiguous() for k, v in reference.state_dict().items()}
    original = to_original_flux_vae_keys(state)
    # Flux's ae.safetensors layout: LDM names, reversed decoder blocks, 1×1-conv attention.
    assert "decoder.up.3.upsample.conv.weight" in original
    assert "decoder.up.0.upsample.conv.weight" not in original
    assert original["encoder.mid.attn_1.q.weight"].ndim == 4
    assert not any("_blocks." in k or k.startswith("first_stage_model.") for k in original)
    folder = models_dir / "vae"
    save_file(state, folder / "ae-diffusers.safetensors")
    save_file(original, folder / "ae-original.safetensors")
    for stem in ("ae-diffusers", "ae-original"):
        sidecar = {"_class_name": "AutoencoderKL", **config}
        (folder / f"{stem}.config.json").write_text(json.dumps(sidecar))

    ours = loading.load_vae(models_dir, "ae-original.safetensors", cpu_policy).module
    theirs = loading.load_vae(models_dir, "ae-diffusers.safetensors", cpu_policy).module
    loaded = ours.state_dict()
    assert loaded.keys() == state.keys()
    assert all(torch.equal(loaded[k], v) for k, v in state.items())

    generator = torch.Generator().manual_seed(3)
    latents = torch.randn(1, 16, 4, 4, generator=generator)
    image = torch.rand(1, 3, 32, 32, generator=generator) * 2 - 1
    with torch.no_grad():
        decoded = [vae.decode(latents).sample for vae in (ours, theirs, reference)]
        encoded = [vae.encode(image).latent_dist for vae in (ours, theirs, reference)]
    assert decoded[0].shape == (1, 3, 32, 32)
    for other in decoded[1:]:
        assert torch.equal(decoded[0], other)
    for other in encoded[1:]:
        assert torch.equal(encoded[0].mean, other.mean) and torch.equal(encoded[0].std, other.std)


def test_a_single_file_text_encoder_with_a_tokenizer_sidecar_encodes_like_its_folder(
    smoke_stack, models_dir, cpu_policy
):
    te_dir = models_dir / "text_encoders" / SMOKE_NAME
    # A Qwen3ForCausalLM-style file, as ComfyUI ships them: "model." prefix and an lm_head.
    state = {f"model.{k}": v for k, v in load_file(te_dir / "model.safetensors").items()}
    state["lm_head.weight"] = torch.zeros(4, 4)
    save_file(state, models_dir / "text_encoders" / "qwen-single.safetensors")
    shutil.copy(te_dir / "config.json", models_dir / "text_encoders" / "qwen-single.config.json")
    tokenizer_dir = models_dir / "text_encoders" / "qwen-single.tokenizer"
    tokenizer_dir.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(te_dir / name, tokenizer_dir / name)

    single = loading.load_text_encoder(models_dir, "qwen-single.safetensors", cpu_policy)
    folder = loading.load_text_encoder(models_dir, SMOKE_NAME, cpu_policy)
    assert torch.equal(engine.encode_prompt(single, "a cat"), engine.encode_prompt(folder, "a cat"))


def test_a_single_file_text_encoder_without_tokenizer_says_where_to_put_one(models_dir, cpu_policy):
    te_dir = models_dir / "text_encoders" / SMOKE_NAME
    shutil.copy(te_dir / "model.safetensors", models_dir / "text_encoders" / "lonely.safetensors")
    with pytest.raises(ModelLoadError, match=r"lonely\.tokenizer"):
        loading.load_text_encoder(models_dir, "lonely.safetensors", cpu_policy)


def test_a_missing_model_fails_the_node_naming_the_file_and_its_folder(models_dir, make_ctx):
    ctx = make_ctx(models_dir=models_dir)
    with pytest.raises(NodeFailed) as caught:
        RUNNERS["load/diffusion-model"](ctx, {"file": "z-image-turbo-bf16.safetensors"}, {})
    assert isinstance(caught.value.__cause__, ModelFileMissing)
    message = str(caught.value)
    assert "z-image-turbo-bf16.safetensors" in message
    assert str(models_dir / "diffusion_models") in message


def test_a_corrupt_file_fails_the_node_naming_the_file_and_its_folder(models_dir, make_ctx):
    (models_dir / "vae" / "broken.safetensors").write_bytes(b"\x00not a safetensors file")
    with pytest.raises(NodeFailed) as caught:
        RUNNERS["load/vae"](make_ctx(models_dir=models_dir), {"file": "broken.safetensors"}, {})
    assert isinstance(caught.value.__cause__, ModelLoadError)
    assert "broken.safetensors" in str(caught.value) and "vae/" in str(caught.value)


def test_a_file_of_another_kind_is_a_load_error_not_a_crash(models_dir, cpu_policy):
    shutil.copy(models_dir / "vae" / SMOKE_FILE, models_dir / "diffusion_models" / "ae.safetensors")
    with pytest.raises(ModelLoadError, match=r"ae\.safetensors"):
        loading.load_diffusion_model(models_dir, "ae.safetensors", cpu_policy)


def test_an_incomplete_file_is_refused(models_dir, cpu_policy):
    state = load_file(models_dir / "diffusion_models" / SMOKE_FILE)
    del state[next(k for k in state if k.endswith("qkv.weight"))]
    save_file(state, models_dir / "diffusion_models" / "cut.safetensors")
    shutil.copy(
        models_dir / "diffusion_models" / f"{SMOKE_NAME}.config.json",
        models_dir / "diffusion_models" / "cut.config.json",
    )
    with pytest.raises(ModelLoadError, match=r"cut\.safetensors"):
        loading.load_diffusion_model(models_dir, "cut.safetensors", cpu_policy)


def test_an_original_flux_layout_vae_file_missing_a_weight_says_so(models_dir, cpu_policy):
    state = to_original_flux_vae_keys(build_tiny_components()["vae"].state_dict())
    del state["decoder.up.3.upsample.conv.weight"]
    save_file(state, models_dir / "vae" / "ae-cut.safetensors")
    shutil.copy(models_dir / "vae" / f"{SMOKE_NAME}.config.json", models_dir / "vae" / "ae-cut.config.json")
    with pytest.raises(ModelLoadError, match=r"ae-cut\.safetensors.*does not hold every weight"):
        loading.load_vae(models_dir, "ae-cut.safetensors", cpu_policy)


def test_loaded_models_are_cached_per_file_hash(smoke_stack, cpu_policy):
    first = loading.load_diffusion_model(smoke_stack.models_dir, SMOKE_FILE, cpu_policy)
    again = loading.load_diffusion_model(smoke_stack.models_dir, SMOKE_FILE, cpu_policy)
    assert first is again and first.batcher is again.batcher


def test_the_shipped_full_size_config_is_z_image_turbo():
    from diffusers import ZImageTransformer2DModel

    config = ZImageTransformer2DModel.load_config(engine.CONFIGS / "transformer" / "config.json")
    with torch.device("meta"):
        model = ZImageTransformer2DModel.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == 6_154_908_736
