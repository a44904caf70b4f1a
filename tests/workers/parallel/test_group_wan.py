"""One Wan video across a worker group of 2 gloo processes: the token sequence F'·H'·W' split
over the ranks (and CFG across them) gives the latents of one process, within float rounding."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.workers.parallel.conftest import CFG, TOLERANCE, ULYSSES
from workers.parallel.group import WorkerGroup
from workers.parallel.protocol import ModelRef

W, H, LATENT_FRAMES = 48, 48, 3  # 3 × 6 × 6 / (1·2·2) = 27 tokens: odd, split 14 + 13


@pytest.fixture(scope="module")
def wan_group() -> Iterator[WorkerGroup]:
    group = WorkerGroup(2, step_timeout=60)
    yield group
    group.close()


@pytest.fixture(scope="module")
def wan_models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    from workers.models.wan.tiny import write_smoke_stack

    models_dir = tmp_path_factory.mktemp("wan-models")
    return models_dir, write_smoke_stack(models_dir)


@pytest.fixture(scope="module")
def wan_single(wan_models: tuple[Path, dict[str, str]]) -> Any:
    from workers.device.policy import DevicePolicy
    from workers.models.wan.loading import load_diffusion_model

    models_dir, names = wan_models
    return load_diffusion_model(models_dir, names["model"], DevicePolicy(profile="cpu"))


@pytest.fixture
def wan_job() -> Callable[..., Any]:
    """wan_job(guidance, seed) -> a fresh Wan SampleJob of a 3-latent-frame clip."""
    import torch

    from workers.models.wan import engine
    from workers.models.wan.tiny import TEXT_WIDTH
    from workers.sampling import SampleJob

    def make(guidance: float = 5.0, seed: int = 1, steps: int = 3) -> SampleJob:
        sigmas, timesteps = engine.schedule(steps, W, H)
        generator = torch.Generator("cpu").manual_seed(seed)
        latents = torch.randn(1, 16, LATENT_FRAMES, H // 8, W // 8, generator=generator)
        positive = torch.randn(512, TEXT_WIDTH, generator=generator)
        negative = torch.randn(512, TEXT_WIDTH, generator=generator) if guidance > 0 else None
        return SampleJob(latents=latents, sigmas=sigmas, timesteps=timesteps, positive=positive,
                         negative=negative, guidance=guidance)

    return make


def test_a_ti2v_image_to_video_clip_split_by_tokens_keeps_its_start_frame_and_per_token_steps(
        wan_group: WorkerGroup, wan_models: tuple[Path, dict[str, str]]) -> None:
    """TI2V-5B: a timestep per token (0 on the kept start frame's) sharded with the tokens, and
    the kept frame put in on every rank: the single-process latents within rounding. (First in
    the module: the next test starts with the same degrees, so the group is not restarted.)"""
    import torch

    from workers.device.policy import DevicePolicy
    from workers.models.wan import engine
    from workers.models.wan.loading import load_diffusion_model
    from workers.models.wan.tiny import TEXT_WIDTH
    from workers.sampling import SampleJob

    models_dir, names = wan_models
    single = load_diffusion_model(models_dir, names["model_ti2v"], DevicePolicy(profile="cpu"))
    shape = (1, 48, LATENT_FRAMES, 2, 4)  # a 64×32 clip at ÷16: 3 × 1 × 2 = 6 tokens

    def job() -> SampleJob:
        generator = torch.Generator("cpu").manual_seed(3)
        samples, mask = torch.zeros(shape), torch.ones(1, 1, *shape[2:])
        samples[:, :, :1], mask[:, :, 0] = torch.randn(1, 48, 1, 2, 4, generator=generator), 0
        sigmas, timesteps = engine.schedule(3, 64, 32)
        return SampleJob(latents=torch.randn(shape, generator=generator), sigmas=sigmas,
                         timesteps=timesteps, positive=torch.randn(512, TEXT_WIDTH,
                                                                   generator=generator),
                         negative=torch.randn(512, TEXT_WIDTH, generator=generator),
                         guidance=5.0, extra={"keep": (samples, mask)})

    expected = single.batcher.run(job())
    split = wan_group.run(job(), ModelRef(str(models_dir), names["model_ti2v"], "float32"),
                          ULYSSES)
    assert float((split - expected).abs().max()) <= TOLERANCE
    assert wan_group.last_report["tokens"] == 6 and wan_group.last_report["local_tokens"] == 3


def test_a_wan_clip_split_over_two_ranks_by_tokens_then_by_cfg_is_the_single_process_clip(
        wan_group: WorkerGroup, wan_models: tuple[Path, dict[str, str]], wan_single: Any,
        wan_job: Callable[..., Any]) -> None:
    models_dir, names = wan_models
    ref = ModelRef(str(models_dir), names["model"], "float32")
    expected = wan_single.batcher.run(wan_job())
    split = wan_group.run(wan_job(), ref, ULYSSES)
    assert split.shape == (1, 16, LATENT_FRAMES, H // 8, W // 8)
    assert float((split - expected).abs().max()) <= TOLERANCE
    assert wan_group.last_report["tokens"] == 27  # split 14 + 13
    assert wan_group.last_report["local_tokens"] == 14
    by_cfg = wan_group.run(wan_job(), ref, CFG)  # restarts the group with cfg=2
    assert float((by_cfg - expected).abs().max()) <= TOLERANCE
    unguided = wan_group.run(wan_job(guidance=0.0, seed=2), ref, CFG)
    assert float((unguided - wan_single.batcher.run(wan_job(guidance=0.0, seed=2))).abs().max()
                 ) <= TOLERANCE

