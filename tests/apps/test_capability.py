"""Capability queue names from a GPU's usable VRAM."""

from __future__ import annotations

import pytest

from apps.fleet.capability import gpu_queue_for_vram


@pytest.mark.parametrize(("vram", "queue"), [
    (4.0, None), (7.6, "gpu.8g"), (23.6, "gpu.24g"), (24.0, "gpu.24g"), (79.2, "gpu.80g"),
    (139.8, "gpu.141g"), (200.0, "gpu.141g"),
])
def test_a_gpu_serves_the_largest_class_it_reaches(vram, queue):
    assert gpu_queue_for_vram(vram) == queue
