"""The models-dir catalog: scanning, resolving, hashing; and it stays torch-free."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workers.models.catalog import ModelFileMissing, file_sha256, resolve, scan


@pytest.fixture
def models_dir(tmp_path: Path) -> Path:
    files = {
        "diffusion_models/z-image-turbo.safetensors": b"transformer",
        "diffusion_models/z-image-turbo.config.json": b"{}",
        "diffusion_models/family/z-alt.sft": b"alt",
        "unet/legacy.ckpt": b"legacy",
        "vae/ae.safetensors": b"vae",
        "vae/README.txt": b"not a model",
        "text_encoders/qwen3/config.json": b"{}",
        "text_encoders/qwen3/model.safetensors": b"weights",
        "text_encoders/qwen_3_4b.safetensors": b"te",
        "text_encoders/qwen_3_4b.tokenizer/tokenizer_config.json": b"{}",
        "loras/.hidden.safetensors": b"hidden",
    }
    for rel, data in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(data)
    return tmp_path


def test_scan_lists_weight_files_and_config_folders_with_sizes(models_dir):
    entries = {(e["folder"], e["name"]): e for e in scan(models_dir)}
    assert set(entries) == {
        ("diffusion_models", "z-image-turbo.safetensors"),
        ("diffusion_models", "family/z-alt.sft"),
        ("diffusion_models", "legacy.ckpt"),  # from the unet/ alias
        ("vae", "ae.safetensors"),
        ("text_encoders", "qwen3"),
        ("text_encoders", "qwen_3_4b.safetensors"),
    }
    assert entries[("vae", "ae.safetensors")] == {
        "folder": "vae",
        "name": "ae.safetensors",
        "kind": "file",
        "size": 3,
        "family": None,  # three bytes: no safetensors header, no family
        "role": None,
        "families": [],
    }
    assert entries[("text_encoders", "qwen3")]["kind"] == "dir"
    assert entries[("text_encoders", "qwen3")]["size"] == len(b"{}") + len(b"weights")


def test_scan_of_a_missing_models_dir_is_empty(tmp_path):
    assert scan(tmp_path / "nowhere") == []


def test_resolve_finds_files_folders_and_aliases(models_dir):
    assert resolve(models_dir, "vae", "ae.safetensors") == models_dir / "vae/ae.safetensors"
    assert resolve(models_dir, "text_encoders", "qwen3") == models_dir / "text_encoders/qwen3"
    assert resolve(models_dir, "diffusion_models", "legacy.ckpt") == models_dir / "unet/legacy.ckpt"


def test_a_missing_model_names_the_file_and_the_folder_it_belongs_in(models_dir):
    with pytest.raises(ModelFileMissing) as caught:
        resolve(models_dir, "vae", "flux-ae.safetensors")
    assert "flux-ae.safetensors" in str(caught.value)
    assert str(models_dir / "vae") in str(caught.value)


@pytest.mark.parametrize("name", ["../vae/ae.safetensors", "/etc/passwd", ""])
def test_names_outside_the_folder_are_refused(models_dir, name):
    with pytest.raises(ModelFileMissing, match="not a model name"):
        resolve(models_dir, "vae", name)


def test_file_sha256_is_the_content_hash_and_follows_changes(models_dir):
    path = models_dir / "vae/ae.safetensors"
    assert file_sha256(path) == hashlib.sha256(b"vae").hexdigest()
    path.write_bytes(b"new vae")
    os.utime(path, ns=(1, 1))  # a new mtime even on coarse clocks
    assert file_sha256(path) == hashlib.sha256(b"new vae").hexdigest()


def test_a_folder_hash_changes_when_any_file_inside_changes(models_dir):
    folder = models_dir / "text_encoders/qwen3"
    before = file_sha256(folder)
    assert file_sha256(folder) == before
    (folder / "model.safetensors").write_bytes(b"other weights")
    os.utime(folder / "model.safetensors", ns=(2, 2))
    assert file_sha256(folder) != before


def test_the_catalog_and_the_runner_modules_import_no_torch():
    code = (
        "import sys, workers.models.catalog, workers.device.policy, workers.device.detect, "
        "workers.runners.diffusion, workers.sampling, workers.models.families; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True)


def test_scan_says_each_file_s_family_and_role_from_its_contents(smoke_stack):
    entries = {(e["folder"], e["name"]): e for e in scan(smoke_stack.models_dir)}
    model = entries[("diffusion_models", smoke_stack.names["model"])]
    vae = entries[("vae", smoke_stack.names["vae"])]
    encoder = entries[("text_encoders", smoke_stack.names["text_encoder"])]
    assert (model["family"], model["role"]) == ("zimage", "transformer")
    assert (vae["role"], encoder["role"]) == ("vae", "text_encoder")
    # a Qwen3 is also FLUX.2 Klein's encoder (its loader's `family` picks)
    assert (vae["families"], encoder["families"]) == (["flux1", "zimage"], ["zimage", "flux2"])
