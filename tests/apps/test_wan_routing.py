"""A video run's memory estimate counts its frames (apps/runs/services/submit.py): a clip of
81 frames needs the activations of 81 images of its size, a still of one."""

from __future__ import annotations

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
