"""A video run's memory estimate counts its frames (apps/runs/services/submit.py): a clip of
81 frames needs the activations of 81 images of its size, a still of one."""

from __future__ import annotations

import pytest

from apps.graphs.schema import GraphDoc
from apps.runs.services.submit import _largest_image


def graph(latent: dict[str, object]) -> GraphDoc:
    return GraphDoc.model_validate({"nodes": {"latent": latent}})


def test_a_clip_s_pixels_are_its_frames_times_its_size():
    clip = graph({"type": "latent/empty-video",
                  "params": {"width": 832, "height": 480, "length": 81, "batch": 1}})
    still = graph({"type": "latent/empty", "params": {"width": 832, "height": 480}})
    assert _largest_image(clip, ["latent"]) == 81 * 832 * 480
    assert _largest_image(still, ["latent"]) == 832 * 480


def test_a_ti2v_5b_clip_counts_the_tokens_of_its_wan22_latents():
    """TI2V-5B's latents are ÷16 (the A14B models' ÷8): a quarter of the tokens per frame, so a
    quarter of the per-megapixel activations; a run of both kinds counts the larger."""
    from apps.fleet.routing import need_estimate
    from apps.graphs.families import activation_for

    base, per_mpx = activation_for(["wan"])
    assert activation_for(["wan"], [("wan", "t2v")]) == (base, per_mpx)
    assert activation_for(["wan"], [("wan", "ti2v")]) == (base, per_mpx / 4)
    assert activation_for(["wan"], [("wan", "ti2v"), ("wan", "i2v")]) == (base, per_mpx)
    clip = graph({"type": "wan/ti2v-latent",
                  "params": {"width": 1280, "height": 704, "length": 121, "batch": 1}})
    pixels = _largest_image(clip, ["latent"])
    assert pixels == 121 * 1280 * 704
    five_b = need_estimate(model_sizes=[10 << 30], pixels=pixels,
                           activation=activation_for(["wan"], [("wan", "ti2v")]))
    a14b = need_estimate(model_sizes=[10 << 30], pixels=pixels,
                         activation=activation_for(["wan"], [("wan", "t2v")]))
    assert five_b.activations_gb - base == pytest.approx((a14b.activations_gb - base) / 4)
