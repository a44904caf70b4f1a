"""Tiled VAE decode / encode (workers/models/tiled_vae.py): the untiled result within float
rounding for every AutoencoderKL family, whatever the tile and overlap; the nodes through the
runners; a VAE it cannot tile is a node error naming it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from tests.workers.helpers import noise_image
from workers.models.tiled_vae import TiledAutoencoder, reach
from workers.runners.base import RUNNERS, NodeFailed


def tiny_vae(family: str) -> Any:
    import importlib

    from diffusers import AutoencoderKL, AutoencoderKLFlux2

    torch.manual_seed(0)
    config = importlib.import_module(f"workers.models.{family}.tiny").VAE_CONFIG
    vae: Any = (AutoencoderKLFlux2 if family == "flux2" else AutoencoderKL)(**config)
    return vae.eval()


@pytest.mark.parametrize(("family", "tile", "overlap"), [
    ("zimage", 32, 0), ("zimage", 48, 16), ("zimage", 1024, 64), ("flux1", 48, 16),
    ("sdxl", 32, 8), ("flux2", 48, 16)])
def test_a_tiled_decode_and_encode_are_the_untiled_ones(family, tile, overlap):
    vae = tiny_vae(family)
    tiled = TiledAutoencoder(vae, tile, overlap)
    z = torch.randn(2, vae.config.latent_channels, 13, 10, generator=torch.Generator().manual_seed(1))
    x = torch.rand(2, 3, 104, 80, generator=torch.Generator().manual_seed(2)) * 2 - 1
    with torch.no_grad():
        decoded, plain = tiled.decode(z)[0], vae.decode(z, return_dict=False)[0]
        moments = tiled.encode(x).latent_dist
        whole = vae.encode(x).latent_dist
    assert decoded.shape == plain.shape
    assert (decoded - plain).abs().max() < 1e-4  # of ±1 pixels: far below one 8-bit level
    assert (moments.mean - whole.mean).abs().max() < 1e-4
    assert (moments.logvar - whole.logvar).abs().max() < 1e-4


def test_diffusers_own_tiles_are_not_the_untiled_image():
    """Why the farm does not use `enable_tiling`: per-tile GroupNorm statistics and attention."""
    vae = tiny_vae("zimage")
    z = torch.randn(1, 16, 24, 20, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain = vae.decode(z, return_dict=False)[0]
        vae.enable_tiling()
        vae.tile_sample_min_size, vae.tile_latent_min_size, vae.tile_overlap_factor = 64, 8, 0.25
        theirs = vae.decode(z, return_dict=False)[0]
        ours = TiledAutoencoder(vae, 64, 16).decode(z)[0]
    assert (theirs - plain).abs().max() > 0.1
    assert (ours - plain).abs().max() < 1e-4


def test_the_reach_counts_each_convolution_s_radius():
    vae = tiny_vae("zimage")  # one resnet a block (two 3×3 convs) and the output conv
    last = vae.decoder.up_blocks[-1]
    assert reach(last, vae.decoder.conv_out) == 2 * len(last.resnets) + 1


def test_the_nodes_give_what_vae_decode_and_encode_give(smoke_stack, make_ctx):
    ctx = make_ctx()
    names = smoke_stack.names

    def run(node_type: str, params: dict[str, Any], inputs: dict[str, Any]) -> Any:
        return RUNNERS[node_type](ctx, params, inputs)

    vae = run("load/vae", {"file": names["vae"]}, {})["vae"]
    image = noise_image(96, 64, seed=4)
    tiles = {"tile_size": 32, "overlap": 8}
    latent = run("vae/encode", {}, {"vae": vae, "image": image})["latent"]
    tiled_latent = run("vae/encode-tiled", tiles, {"vae": vae, "image": image})["latent"]
    assert (tiled_latent.samples - latent.samples).abs().max() < 1e-4
    plain = np.asarray(run("vae/decode", {}, {"vae": vae, "latent": latent})["image"], dtype=int)
    tiled = np.asarray(run("vae/decode-tiled", tiles, {"vae": vae, "latent": latent})["image"],
                       dtype=int)
    assert tiled.shape == plain.shape == (64, 96, 3)
    assert np.abs(tiled - plain).max() <= 1


def test_a_vae_it_cannot_tile_is_a_node_error_naming_it(make_ctx, tmp_path):
    from workers.models.qwenimage.tiny import write_smoke_stack

    names = write_smoke_stack(tmp_path)
    ctx = make_ctx(models_dir=tmp_path)
    vae = RUNNERS["load/vae"](ctx, {"file": names["vae"]}, {})["vae"]
    with pytest.raises(NodeFailed, match=rf"{names['vae']} \(qwenimage\) cannot be tiled"):
        RUNNERS["vae/encode-tiled"](ctx, {}, {"vae": vae, "image": noise_image(32, 32, seed=1)})
