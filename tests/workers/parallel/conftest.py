"""Worker groups of 2 gloo rank processes on the tiny smoke stack, shared by a module's tests
(a group takes seconds to start on these cores; the tests that break one see it restart)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.workers.conftest import SmokeStack
from workers.parallel.config import Degrees
from workers.parallel.group import WorkerGroup
from workers.parallel.protocol import ModelRef

TOLERANCE = 1e-5  # max |split − single-process| of the final latents (float32 on CPU)


@pytest.fixture(scope="module")
def ulysses_group() -> Iterator[WorkerGroup]:
    group = WorkerGroup(2, step_timeout=60)
    yield group
    group.close()


@pytest.fixture(scope="module")
def cfg_group() -> Iterator[WorkerGroup]:
    group = WorkerGroup(2, step_timeout=60)
    yield group
    group.close()


@pytest.fixture(scope="session")
def model_ref(smoke_stack: SmokeStack) -> ModelRef:
    return ModelRef(str(smoke_stack.models_dir), smoke_stack.names["model"], "float32")


@pytest.fixture(scope="session")
def single(smoke_stack: SmokeStack) -> Any:
    """The tiny transformer in this process with its step batcher: the reference."""
    from workers.device.policy import DevicePolicy
    from workers.models.zimage.loading import load_diffusion_model

    return load_diffusion_model(smoke_stack.models_dir, smoke_stack.names["model"],
                                DevicePolicy(profile="cpu"))


@pytest.fixture
def make_job() -> Callable[..., Any]:
    """make_job(guidance=0.0, steps=4, width=64, height=48, seed=1) -> a fresh SampleJob."""
    import torch

    from workers.models.zimage import engine
    from workers.sampling import SampleJob

    def make(guidance: float = 0.0, steps: int = 4, width: int = 64, height: int = 48,
             seed: int = 1) -> SampleJob:
        sigmas, timesteps = engine.sigma_schedule(steps, width, height)
        generator = torch.Generator("cpu").manual_seed(seed)
        latents = engine.noise(engine.latent_shape(width, height), generator, "cpu")
        positive = torch.randn(7, 16, generator=generator)  # [L, cap_feat_dim]
        negative = torch.randn(5, 16, generator=generator) if guidance > 0 else None
        return SampleJob(latents=latents, sigmas=sigmas, timesteps=timesteps, positive=positive,
                         negative=negative, guidance=guidance)

    return make


ULYSSES, CFG = Degrees(ulysses=2), Degrees(cfg=2)
