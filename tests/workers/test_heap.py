"""The collector's full passes skip what a worker loads once, but never a model (inline_farm/heap.py)."""

from __future__ import annotations

import gc

from workers.device.policy import DevicePolicy
from workers.models.zimage.loading import load_diffusion_model, load_vae


def _in_collected_generations(obj: object) -> bool:
    """Whether `obj` is in a generation the collector walks (`gc.get_objects` leaves the frozen
    permanent generation out)."""
    return any(tracked is obj for tracked in gc.get_objects())


def test_the_model_libraries_are_frozen_but_a_loaded_model_is_not(smoke_stack):
    policy = DevicePolicy(profile="cpu")
    model = load_diffusion_model(smoke_stack.models_dir, smoke_stack.names["model"], policy)
    vae = load_vae(smoke_stack.models_dir, smoke_stack.names["vae"], policy)

    import diffusers

    assert gc.get_freeze_count() > 100_000  # torch, diffusers, transformers: out of every pass
    assert not _in_collected_generations(diffusers.AutoencoderKL)
    # A model may sit in reference cycles (accelerate's hooks, a module's back-references): a
    # frozen one could never be freed after it leaves the model cache.
    assert _in_collected_generations(model.transformer)
    assert _in_collected_generations(vae.module)
