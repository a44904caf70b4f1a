"""Upscale models without spandrel: ESRGAN-family files in every key layout load as the published
architectures (a reference forward written here from the papers' code, functional, on the file's
own tensors), tiles give the untiled result, and the nodes run as the executor calls them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from tests.workers.conftest import Recorder
from tests.workers.helpers import noise_image
from workers.device.policy import DevicePolicy
from workers.models.catalog import scan
from workers.models.upscale import NotAnUpscaler, UpscaleSpec, recognise
from workers.models.upscale.loading import load_upscale_model, upscale
from workers.models.upscale.tiny import TINY_ESRGAN, tiny_net, write_tiny_upscaler
from workers.runners import upscale as upscale_runners  # noqa: F401  (registers the runners)
from workers.runners.base import RUNNERS, NodeContext, NodeFailed

CPU = DevicePolicy(profile="cpu")
X2_UNSHUFFLE = UpscaleSpec("esrgan", 2, 3, 3, features=8, blocks=2, growth=4, upsamples=2,
                           unshuffle=2)
X8_OLD = UpscaleSpec("esrgan", 8, 3, 3, features=6, blocks=1, growth=3, upsamples=3)
COMPACT = UpscaleSpec("compact", 4, 3, 3, features=8, blocks=3)


# --- the reference: BasicSR's rrdbnet_arch.py / srvgg_arch.py, written out functionally -----------


def _conv(sd: dict[str, torch.Tensor], name: str, x: torch.Tensor) -> torch.Tensor:
    return F.conv2d(x, sd[f"{name}.weight"], sd[f"{name}.bias"], stride=1, padding=1)


def _lrelu(x: torch.Tensor) -> torch.Tensor:
    return F.leaky_relu(x, negative_slope=0.2)


def reference_rrdbnet(sd: dict[str, torch.Tensor], x: torch.Tensor, scale: int) -> torch.Tensor:
    """RRDBNet.forward (Real-ESRGAN): scale 2 / 1 pixel-unshuffle the input by 2 / 4; two ×2
    nearest + conv + lrelu stages (the ×8 variant: three); conv_hr, lrelu, conv_last."""
    feat = {2: lambda t: F.pixel_unshuffle(t, 2), 1: lambda t: F.pixel_unshuffle(t, 4)}.get(
        scale, lambda t: t)(x)
    feat = _conv(sd, "conv_first", feat)
    trunk = feat
    n = 0
    while f"body.{n}.rdb1.conv1.weight" in sd:
        block_in = trunk
        for r in (1, 2, 3):
            p, rdb_in = f"body.{n}.rdb{r}", trunk
            x1 = _lrelu(_conv(sd, f"{p}.conv1", rdb_in))
            x2 = _lrelu(_conv(sd, f"{p}.conv2", torch.cat((rdb_in, x1), 1)))
            x3 = _lrelu(_conv(sd, f"{p}.conv3", torch.cat((rdb_in, x1, x2), 1)))
            x4 = _lrelu(_conv(sd, f"{p}.conv4", torch.cat((rdb_in, x1, x2, x3), 1)))
            x5 = _conv(sd, f"{p}.conv5", torch.cat((rdb_in, x1, x2, x3, x4), 1))
            trunk = x5 * 0.2 + rdb_in
        trunk = trunk * 0.2 + block_in
        n += 1
    feat = feat + _conv(sd, "conv_body", trunk)
    k = 1
    while f"conv_up{k}.weight" in sd:
        feat = _lrelu(_conv(sd, f"conv_up{k}", F.interpolate(feat, scale_factor=2, mode="nearest")))
        k += 1
    return _conv(sd, "conv_last", _lrelu(_conv(sd, "conv_hr", feat)))


def reference_compact(sd: dict[str, torch.Tensor], x: torch.Tensor, scale: int) -> torch.Tensor:
    """SRVGGNetCompact.forward: conv, PReLU, …, conv; pixel shuffle; + nearest-upscaled input."""
    out, index = x, 0
    while f"body.{index}.weight" in sd:
        if sd[f"body.{index}.weight"].ndim == 4:
            out = _conv(sd, f"body.{index}", out)
        else:
            out = F.prelu(out, sd[f"body.{index}.weight"])
        index += 1
    return F.pixel_shuffle(out, scale) + F.interpolate(x, scale_factor=scale, mode="nearest")


def image_tensor(width: int, height: int, seed: int = 1) -> torch.Tensor:
    return torch.rand(1, 3, height, width, generator=torch.Generator().manual_seed(seed))


# --- loading -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "reference"), [
    (TINY_ESRGAN, reference_rrdbnet), (X2_UNSHUFFLE, reference_rrdbnet),
    (X8_OLD, reference_rrdbnet), (COMPACT, reference_compact),
])
def test_a_saved_tiny_net_loads_as_the_published_architecture(tmp_path, spec, reference):
    write_tiny_upscaler(tmp_path, "net.safetensors", spec=spec, seed=4)
    model = load_upscale_model(tmp_path, "net.safetensors", CPU)
    assert model.spec == spec  # scale, nf, nb, gc, channels, unshuffle: read from the shapes
    x = image_tensor(20, 12)
    sd = tiny_net(spec, seed=4).state_dict()
    expected = reference(sd, x, spec.scale)
    got = upscale(model, x, tile=512, overlap=0)
    assert got.shape == (1, 3, 12 * spec.scale, 20 * spec.scale)
    assert torch.allclose(got, expected, atol=1e-6, rtol=0), (got - expected).abs().max()


@pytest.mark.parametrize("spec", [TINY_ESRGAN, X2_UNSHUFFLE, X8_OLD])
def test_the_original_esrgan_layout_converts_bit_for_bit(tmp_path, spec):
    """The same weights saved as `model.N…` in a `.pth` (wrapped in params_ema, as Real-ESRGAN
    ships them) and in the new layout as safetensors: the same tensors, the same output bits."""
    write_tiny_upscaler(tmp_path, "new.safetensors", spec=spec, seed=2)
    write_tiny_upscaler(tmp_path, "old.pth", spec=spec, seed=2, layout="old")
    saved = torch.load(tmp_path / "upscale_models" / "old.pth", weights_only=True)["params_ema"]
    assert "model.1.sub.0.RDB1.conv1.0.weight" in saved and "conv_first.weight" not in saved
    new = load_upscale_model(tmp_path, "new.safetensors", CPU)
    old = load_upscale_model(tmp_path, "old.pth", CPU)
    assert old.spec == new.spec == spec
    for (name, a), (other, b) in zip(new.net.state_dict().items(), old.net.state_dict().items(),
                                     strict=True):
        assert name == other and torch.equal(a, b)
    x = image_tensor(16, 16, seed=7)
    assert torch.equal(upscale(new, x, tile=512, overlap=0), upscale(old, x, tile=512, overlap=0))


def test_the_intermediate_basicsr_layout_is_recognised_too():
    shapes = {k: tuple(v.shape) for k, v in tiny_net().state_dict().items()}
    stems = {"conv_body": "trunk_conv", "conv_up1": "upconv1", "conv_up2": "upconv2",
             "conv_hr": "HRconv"}

    def older(key: str) -> str:
        if key.startswith("body."):
            return "RRDB_trunk." + key[len("body."):].replace(".rdb", ".RDB")
        stem, _, kind = key.rpartition(".")
        return f"{stems.get(stem, stem)}.{kind}"

    renamed = {older(k): s for k, s in shapes.items()}
    assert "trunk_conv.weight" in renamed and "RRDB_trunk.0.RDB3.conv5.bias" in renamed
    assert recognise(renamed) == TINY_ESRGAN


@pytest.mark.parametrize(("shapes", "why"), [
    ({"layers.0.residual_group.blocks.0.norm1.weight": (60,)}, "no upscale architecture"),
    ({"decoder.conv_in.weight": (512, 16, 3, 3)}, "no upscale architecture"),
    ({**{k: tuple(v.shape) for k, v in tiny_net().state_dict().items()},
      "body.0.rdb1.conv1x1.weight": (4, 8, 1, 1)}, "unexpected weights"),  # ESRGAN+
])
def test_weights_of_another_architecture_are_refused_saying_why(shapes, why):
    with pytest.raises(NotAnUpscaler, match=why):
        recognise(shapes)


def make_ctx(models_dir: Path, recorder: Recorder | None = None) -> NodeContext:
    recorder = recorder or Recorder()
    return NodeContext(run_id="run-1", node_id="up", node_type="test", graph_sha256="0" * 64,
                       models_dir=models_dir, owner_id=1, policy=CPU,
                       check_cancelled=recorder.check_cancelled, report_progress=recorder.report)


def test_a_file_of_no_known_architecture_fails_its_node_naming_the_file(tmp_path):
    from safetensors.torch import save_file

    (tmp_path / "upscale_models").mkdir()
    save_file({"layers.0.attn.qkv.weight": torch.zeros(6, 2)},
              str(tmp_path / "upscale_models" / "swinir.safetensors"))
    torch.save({"note": "not weights"}, tmp_path / "upscale_models" / "empty.pth")
    (tmp_path / "upscale_models" / "broken.pth").write_bytes(b"not a pickle")
    for name, why in (("swinir.safetensors", "no upscale architecture"),
                      ("empty.pth", "holds no weights"), ("broken.pth", "cannot read")):
        with pytest.raises(NodeFailed, match=why) as failure:
            RUNNERS["load/upscale-model"](make_ctx(tmp_path), {"file": name}, {})
        assert name in str(failure.value)
    with pytest.raises(NodeFailed, match=r"put it in .*upscale_models"):
        RUNNERS["load/upscale-model"](make_ctx(tmp_path), {"file": "absent.pth"}, {})


# --- tiles ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "size"), [(TINY_ESRGAN, (50, 37)), (X2_UNSHUFFLE, (49, 45))])
def test_tiles_with_enough_overlap_give_the_untiled_result(tmp_path, spec, size):
    """The tiny nets see ~19 (×4) and ~20 (×2, unshuffled) input pixels around each output
    pixel: 24 pixels of overlap cover it, so 16-pixel tiles are the whole-image forward up to
    float rounding; with no overlap the tiles' zero-padded edges show (the test can fail)."""
    write_tiny_upscaler(tmp_path, "net.safetensors", spec=spec)
    model = load_upscale_model(tmp_path, "net.safetensors", CPU)
    x = image_tensor(size[0], size[1], seed=3)
    whole = upscale(model, x, tile=4096, overlap=0)
    ticks: list[tuple[int, int]] = []
    tiled = upscale(model, x, tile=16, overlap=24, progress=lambda d, t: ticks.append((d, t)))
    assert whole.shape == tiled.shape == (1, 3, size[1] * spec.scale, size[0] * spec.scale)
    assert (tiled - whole).abs().max() < 1e-5
    assert ticks == [(n, 12) for n in range(1, 13)]  # ⌈50 / 16⌉ × ⌈37 / 16⌉ (50 × 46 padded)
    assert (upscale(model, x, tile=16, overlap=0) - whole).abs().max() > 1e-2


# --- the nodes -----------------------------------------------------------------------------------


def test_the_nodes_upscale_an_image_by_the_models_factor_in_tiles(tmp_path):
    write_tiny_upscaler(tmp_path, "x4.pth", layout="old")
    recorder = Recorder()
    ctx = make_ctx(tmp_path, recorder)
    model = RUNNERS["load/upscale-model"](ctx, {"file": "x4.pth"}, {})["upscale_model"]
    image = noise_image(40, 24, seed=9)
    out = RUNNERS["image/upscale-with-model"](ctx, {"tile": 16, "overlap": 24},
                                              {"upscale_model": model, "image": image})["image"]
    assert out.mode == "RGB" and out.size == (160, 96)
    x = torch.from_numpy(np.asarray(image, np.float32) / 255.0).permute(2, 0, 1)[None]
    expected = reference_rrdbnet(tiny_net().state_dict(), x, 4).clamp(0, 1)
    got = torch.from_numpy(np.asarray(out, np.float32) / 255.0).permute(2, 0, 1)[None]
    assert (got - expected).abs().max() <= 0.5 / 255 + 1e-5  # 8-bit rounding only
    assert recorder.progress[-1] == (6, 6)  # 3 × 2 tiles of 16
    assert "upscale_models/x4.pth" in ctx.lineage["models"]


def test_an_rgba_image_is_upscaled_as_rgb_and_a_huge_result_is_refused(tmp_path):
    write_tiny_upscaler(tmp_path, "x4.safetensors")
    ctx = make_ctx(tmp_path)
    model = RUNNERS["load/upscale-model"](ctx, {"file": "x4.safetensors"}, {})["upscale_model"]
    rgba = Image.new("RGBA", (8, 8), (10, 200, 30, 40))
    out = RUNNERS["image/upscale-with-model"](ctx, {"tile": 512, "overlap": 32},
                                              {"upscale_model": model, "image": rgba})["image"]
    assert out.mode == "RGB" and out.size == (32, 32)
    with pytest.raises(NodeFailed, match="past the farm's limit"):
        RUNNERS["image/upscale-with-model"](ctx, {"tile": 512, "overlap": 32}, {
            "upscale_model": model, "image": Image.new("RGB", (2100, 2100))})  # → 8400²


def test_the_catalog_lists_upscale_models_with_their_role(tmp_path):
    write_tiny_upscaler(tmp_path, "x4.safetensors")
    write_tiny_upscaler(tmp_path, "x4.pth")
    (tmp_path / "upscale_models" / "odd.safetensors").write_bytes(_other_header())
    entries: dict[Any, Any] = {(e["folder"], e["name"]): e for e in scan(tmp_path)}
    assert entries[("upscale_models", "x4.safetensors")]["role"] == "upscaler"
    assert entries[("upscale_models", "x4.pth")]["role"] is None  # a pickle: its load says
    assert entries[("upscale_models", "odd.safetensors")]["role"] is None
    assert all(e["family"] is None for k, e in entries.items() if k[0] == "upscale_models")


def _other_header() -> bytes:
    import json
    import struct

    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    return struct.pack("<Q", len(header)) + header + b"\0\0\0\0"


def test_frames_are_each_upscaled_as_the_image_node_upscales_them(tmp_path):
    from workers.models.values import Frames

    write_tiny_upscaler(tmp_path, "x4.pth", layout="old")
    recorder = Recorder()
    ctx = make_ctx(tmp_path, recorder)
    model = RUNNERS["load/upscale-model"](ctx, {"file": "x4.pth"}, {})["upscale_model"]
    pictures = [noise_image(20, 12, seed=s) for s in (1, 2, 3)]
    frames = Frames(np.stack([np.asarray(p) for p in pictures]))
    params = {"tile": 16, "overlap": 8}
    out = RUNNERS["frames/upscale-with-model"](ctx, params, {"upscale_model": model,
                                                             "frames": frames})["frames"]
    assert out.array.shape == (3, 48, 80, 3) and out.array.dtype == np.uint8
    assert recorder.progress == [(1, 3), (2, 3), (3, 3)]  # by frame, not by tile
    for picture, frame in zip(pictures, out.array, strict=True):
        image = RUNNERS["image/upscale-with-model"](ctx, params, {"upscale_model": model,
                                                                  "image": picture})["image"]
        assert np.array_equal(np.asarray(image), frame)
    with pytest.raises(NodeFailed, match="must be an upscale model and frames"):
        RUNNERS["frames/upscale-with-model"](ctx, params, {"upscale_model": model,
                                                           "frames": pictures[0]})
