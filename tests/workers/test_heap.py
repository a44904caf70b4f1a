"""The collector's full passes skip what a worker loads once, but never a model (inline_farm/heap.py)."""

from __future__ import annotations

import gc
import weakref

from workers.device.policy import DevicePolicy
from workers.models.cache import MODEL_CACHE
from workers.models.zimage.loading import load_diffusion_model, load_vae


def test_the_model_libraries_are_frozen_but_a_dropped_model_is_still_collected(smoke_stack):
    policy = DevicePolicy(profile="cpu")
    model = load_diffusion_model(smoke_stack.models_dir, smoke_stack.names["model"], policy)
    vae = load_vae(smoke_stack.models_dir, smoke_stack.names["vae"], policy)
    assert gc.get_freeze_count() > 100_000  # diffusers, transformers, torch: out of every pass

    # Both models sit in reference cycles: only the collector frees them, so neither may be frozen.
    dropped = [weakref.ref(model.transformer), weakref.ref(vae.module)]
    MODEL_CACHE.clear()
    del model, vae
    gc.collect()
    assert [ref() for ref in dropped] == [None, None]
