"""ComfyUI's SDTurboScheduler (sampling/sd-turbo-scheduler) and its shipped `sdxlturbo_example`
(CheckpointLoaderSimple → SamplerCustom with euler_ancestral over SDTurboScheduler's one step)
imported from the UI format and rendered on the tiny SDXL checkpoint."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from apps.importer.services import comfy_import
from tests.workers.vocab_helpers import render, take_image
from workers.runners import RUNNERS


def comfyui_sd_turbo(steps: int, denoise: float) -> torch.Tensor:
    """SDTurboScheduler.get_sigmas written out over SDXL's ModelSamplingDiscrete (its
    scaled-linear table in float32, `sigma(t)` through the log table as ComfyUI's)."""
    betas = torch.linspace(0.00085 ** 0.5, 0.012 ** 0.5, 1000, dtype=torch.float64) ** 2
    alphas = torch.cumprod(1.0 - betas, dim=0).float()
    log_sigmas = (((1 - alphas) / alphas) ** 0.5).log()
    start = 10 - int(10 * denoise)
    timesteps = torch.flip(torch.arange(1, 11) * 100 - 1, (0,))[start:start + steps].float()
    return torch.cat([log_sigmas[timesteps.long()].exp(), torch.zeros(1)])


@pytest.fixture(scope="module")
def sdxl_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, str]:
    from workers.models.sdxl.tiny import write_smoke_stack

    models_dir = tmp_path_factory.mktemp("sd-turbo-models")
    return models_dir, write_smoke_stack(models_dir)["checkpoint"]


@pytest.mark.parametrize(("steps", "denoise"), [(1, 1.0), (4, 1.0), (2, 0.5), (10, 0.3)])
def test_the_sigmas_are_comfyuis(sdxl_checkpoint, make_ctx, steps, denoise):
    models_dir, checkpoint = sdxl_checkpoint
    ctx = make_ctx(models_dir=models_dir)
    model = RUNNERS["load/checkpoint"](ctx, {"file": checkpoint}, {})["model"]
    sigmas = RUNNERS["sampling/sd-turbo-scheduler"](ctx, {"steps": steps, "denoise": denoise},
                                                   {"model": model})["sigmas"]
    assert torch.equal(sigmas.values, comfyui_sd_turbo(steps, denoise))
    assert len(sigmas.values) == min(steps, int(10 * denoise)) + 1


def test_a_flow_model_is_refused_by_name(smoke_stack, make_ctx):
    from workers.runners.base import NodeFailed

    ctx = make_ctx(models_dir=smoke_stack.models_dir)
    model = RUNNERS["load/diffusion-model"](ctx, {"file": smoke_stack.names["model"]},
                                            {})["model"]
    with pytest.raises(NodeFailed, match="flow model: SD Turbo's timesteps are a discrete "):
        RUNNERS["sampling/sd-turbo-scheduler"](ctx, {"steps": 1, "denoise": 1.0},
                                               {"model": model})


@pytest.mark.django_db
def test_comfyuis_shipped_sdxl_turbo_example_imports_and_renders(settings, tmp_path,
                                                                 sdxl_checkpoint):
    from apps.importer.comfy_templates import shipped_file

    models_dir, checkpoint = sdxl_checkpoint
    settings.INLINE_BLOB_DIR, settings.INLINE_MODELS_DIR = tmp_path / "blobs", models_dir
    workflow = json.loads(shipped_file("sdxlturbo_example.json") or b"{}")
    for node in workflow["nodes"]:
        if node["type"] == "CheckpointLoaderSimple":
            node["widgets_values"] = [checkpoint]
        if node["type"] == "EmptyLatentImage":
            node["widgets_values"] = [64, 48, 1]
    result = comfy_import(workflow=workflow, catalog={"checkpoints": [checkpoint]},
                          files={("checkpoints", checkpoint): ("sdxl",)})
    assert result.report.unmapped == []
    nodes = result.graph.model_dump()["nodes"]
    assert nodes["22"] == {"type": "sampling/sd-turbo-scheduler", "params": {"steps": 1,
                           "denoise": 1.0}, "inputs": {"model": {"node": "20", "port": "model"}}}
    outcome, run = render(nodes, result.target)
    assert outcome.status == "succeeded", outcome.error
    assert take_image(run).size == (64, 48)
