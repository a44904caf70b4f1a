"""The family seam: files are recognised from their contents, and the generic nodes reach a
family only through the registry."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from workers.models.families import REGISTERED, identify, info, loader_family, plugin
from workers.models.family import FamilyPlugin, ModelLoadError
from workers.models.header import HeaderUnreadable, read_header
from workers.models.zimage.tiny import SMOKE_NAME

SMOKE_FILE = f"{SMOKE_NAME}.safetensors"


def test_the_smoke_stack_s_files_are_recognised_by_role(smoke_stack):
    d = smoke_stack.models_dir
    assert identify(d / "diffusion_models" / SMOKE_FILE).role == "transformer"
    assert identify(d / "vae" / SMOKE_FILE).role == "vae"
    assert identify(d / "text_encoders" / SMOKE_NAME).role == "text_encoder"
    assert identify(d / "diffusion_models" / SMOKE_FILE).family == "zimage"


def test_a_renamed_file_is_recognised_from_its_keys_not_its_name(smoke_stack, tmp_path):
    renamed = tmp_path / "flux1-dev.safetensors"
    shutil.copy(smoke_stack.models_dir / "vae" / SMOKE_FILE, renamed)
    assert identify(renamed).role == "vae"
    assert identify(renamed, "diffusion_models").families == ()  # a VAE is no denoiser


def test_a_file_no_family_recognises_is_a_load_error_naming_it_and_its_folder(tmp_path):
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    path = tmp_path / "mystery.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 4)
    with pytest.raises(ModelLoadError, match=r"mystery\.safetensors from vae/: no registered"):
        loader_family(path, "vae")


def test_a_corrupt_header_is_unreadable_not_a_crash(tmp_path):
    path = tmp_path / "broken.safetensors"
    path.write_bytes(b"\x00not a safetensors file")
    with pytest.raises(HeaderUnreadable, match=r"broken\.safetensors"):
        read_header(path)


def test_every_registered_family_offers_the_whole_contract():
    for family_id in REGISTERED:
        assert info(family_id).id == family_id
        module = plugin(family_id)
        for name in FamilyPlugin.__dict__:
            if not name.startswith("_"):
                assert callable(getattr(module, name)), f"{family_id}.plugin lacks {name}"


def test_recognising_files_imports_no_torch(smoke_stack):
    code = ("import sys; from pathlib import Path; from workers.models.families import identify; "
            f"print(identify(Path({str(smoke_stack.models_dir / 'vae' / SMOKE_FILE)!r})).role); "
            "assert 'torch' not in sys.modules and 'safetensors' not in sys.modules")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, check=True, capture_output=True,
                         text=True)
    assert out.stdout.strip() == "vae"


def test_a_diffusers_lora_of_joint_blocks_is_flux_s_unless_it_has_qwen_image_s_modules(tmp_path):
    """Attention keys (`add_q_proj`) are in both FLUX.1's and Qwen-Image's joint blocks; one
    `img_mlp` / `txt_mod` module makes the file Qwen-Image's."""
    import torch
    from safetensors.torch import save_file

    def lora(name: str, modules: list[str]) -> Path:
        path = tmp_path / name
        save_file({f"transformer_blocks.0.{m}.lora_{ab}.weight": torch.zeros(4, 4)
                   for m in modules for ab in "AB"}, str(path))
        return path

    attention = ["attn.to_q", "attn.add_q_proj"]
    assert identify(lora("flux.safetensors", attention), "loras").family == "flux1"
    qwen = identify(lora("qwen.safetensors", [*attention, "img_mlp.net.2"]), "loras")
    assert (qwen.role, qwen.family) == ("lora", "qwenimage")


def test_a_lora_of_single_stream_blocks_is_qwen_image_2_1_s_by_its_mlp_or_its_width(tmp_path):
    """Qwen-Image 2.1 kept Qwen-Image's `transformer_blocks.N.img_mlp` but its SwiGLU modules
    are its own (`gate_layer`, `proj`, `out`: Qwen-Image's is `net.0.proj`); attention alone
    with no joint `add_q_proj` is 2.1's at its 4096 width, nobody's at 3072."""
    import torch
    from safetensors.torch import save_file

    def lora(name: str, modules: list[str], width: int = 4) -> Path:
        path = tmp_path / name
        save_file({f"diffusion_model.transformer_blocks.0.{m}.lora_{ab}.weight":
                   torch.zeros((4, width) if ab == "A" else (width, 4))
                   for m in modules for ab in "AB"}, str(path))
        return path

    def found(path: Path) -> tuple[str, tuple[str, ...]]:
        identity = identify(path, "loras")
        return identity.role, identity.families

    attention = ["attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0"]
    assert found(lora("gate.safetensors", [*attention, "img_mlp.gate_layer"])) == \
        ("lora", ("qwenimage21",))
    assert found(lora("mlp.safetensors", ["img_mlp.proj", "img_mlp.out"])) == \
        ("lora", ("qwenimage21",))
    assert found(lora("qwen.safetensors", ["attn.to_q", "img_mlp.net.0.proj"])) == \
        ("lora", ("qwenimage",))
    assert found(lora("wide.safetensors", attention, width=4096)) == ("lora", ("qwenimage21",))
    assert found(lora("narrow.safetensors", attention, width=3072)) == ("", ())
    assert found(lora("joint.safetensors", [*attention, "attn.add_q_proj"], width=4096)) == \
        ("lora", ("flux1",))
