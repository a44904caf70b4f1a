"""SDXL through /v1 on a real worker, beside the other families: ComfyUI's default workflow
(CheckpointLoaderSimple … KSampler … SaveImage, UI format) imported onto the smoke checkpoint,
queued with FLUX.1 and Z-Image runs on one worker, every take the pixels of its family's
diffusers pipeline."""

from __future__ import annotations

import copy
import json
import time
from typing import Any

import numpy as np
import pytest
import torch

from tests.apps.importer.builder import workflow
from tests.conftest import smoke_stack_reported
from tests.e2e import test_flux1 as flux_e2e
from tests.e2e.test_flux1 import flux  # noqa: F401 (the FLUX.1 stack fixture)
from tests.e2e.test_generation import primitive_graph, take_pixels
from tests.e2e.test_generation import reference as zimage_reference
from tests.livefarm import Client

pytestmark = pytest.mark.e2e

W, H, STEPS, CFG = 64, 48, 3, 6.0
PROMPT, NEGATIVE = "a harbour at night", "text, watermark"
SEEDS = (3, 4)


@pytest.fixture(scope="module")
def sdxl(farm, data_dirs, personas) -> str:
    """The smoke checkpoint in the worker's models dir, once its heartbeat reports it."""
    from workers.models.sdxl.tiny import write_smoke_stack

    name = write_smoke_stack(data_dirs["models"])["checkpoint"]
    deadline = time.monotonic() + 30
    with Client(base_url=farm.url, headers={"Authorization": f"Bearer {personas['owner']}"},
                timeout=30) as client:
        while time.monotonic() < deadline:
            if name in {f["name"] for f in client.get("/v1/models/files?family=sdxl").json()["files"]}:
                return name
            time.sleep(0.2)
    raise AssertionError("no worker reported the SDXL smoke checkpoint")


@pytest.fixture(scope="module")
def zimage(farm, data_dirs, personas) -> dict[str, str]:
    return smoke_stack_reported(farm, personas["owner"], data_dirs["models"])


def imported_sdxl(client: Client, checkpoint: str) -> dict[str, Any]:
    """ComfyUI's default workflow, set to the smoke checkpoint, through /v1/import/comfy."""
    doc = workflow("sdxl_base.ui.json")
    widgets = {n["id"]: n["widgets_values"] for n in doc["nodes"]}
    widgets[4][0], widgets[5][:2], widgets[6][0], widgets[7][0] = checkpoint, [W, H], PROMPT, NEGATIVE
    widgets[3][2:4] = [STEPS, CFG]
    response = client.post("/v1/import/comfy", content=json.dumps(doc).encode(),
                           headers={"Content-Type": "application/json"})
    assert response.status_code == 200, response.text
    return {"graph": response.json()["graph"], "target": response.json()["target"]}


def sdxl_reference(seed: int) -> np.ndarray:
    """What ComfyUI renders for the default workflow's KSampler (euler, normal): its euler
    (tests/workers/comfy_reference.py) over ModelSamplingDiscrete's normal sigmas, with CFG,
    on the smoke pipeline's UNet, from the farm's seeded noise, decoded by its VAE."""
    from tests.workers import comfy_reference as ref
    from workers.device.policy import Placement
    from workers.models.sdxl import LATENT, engine, plugin
    from workers.models.sdxl.tiny import smoke_pipeline
    from workers.models.values import TextEncoder, Vae
    from workers.runners.diffusion import noise
    from workers.sampling import SampleJob
    from workers.sampling.schedulers import calculate_sigmas

    pipe, cpu = smoke_pipeline(), Placement("cpu", "float32")
    encoder = TextEncoder("", "", (pipe.text_encoder, pipe.text_encoder_2),
                          (pipe.tokenizer, pipe.tokenizer_2), cpu)
    positive, negative = engine.encode_prompts(encoder, [PROMPT, NEGATIVE])
    ms = plugin.model_sampling(W, H)
    sigmas = calculate_sigmas(ms, "normal", STEPS)

    def model(x: Any, sigma: Any) -> Any:
        sigma = sigma.reshape(()).float()
        job = SampleJob(x, torch.stack([sigma, torch.tensor(0.0)]),
                        ms.model_timestep(sigma).reshape(1), positive, negative=negative,
                        guidance=CFG - 1)
        return plugin.to_denoised(job, engine.predict(pipe.unet, [job])[0])

    eps = noise(LATENT.shape(W, H), torch.Generator("cpu").manual_seed(seed), "cpu")
    start = ms.noise_scaling(sigmas[0], eps, torch.zeros(1), True)
    with torch.no_grad():
        x = ref.REFERENCE["euler"](model, start, sigmas, ms, ref.default_noise_sampler(start, seed))
        image = engine.decode_latents_batch(Vae("", "", pipe.vae, cpu), [x])[0]
    return np.asarray(image.convert("RGB"))


def test_a_mixed_queue_of_three_families_on_one_worker_renders_each_as_its_reference(
        owner, sdxl, flux, zimage):  # noqa: F811 (the imported fixture)
    from workers.models.flux1.tiny import smoke_pipeline as flux_pipeline

    files = {f["name"]: f for f in owner.get("/v1/models/files").json()["files"]}
    assert (files[sdxl]["folder"], files[sdxl]["family"], files[sdxl]["role"]) == (
        "checkpoints", "sdxl", "checkpoint")
    body = imported_sdxl(owner, sdxl)
    runs: dict[str, Any] = {}
    for seed in SEEDS:  # two SDXL runs (they may share forwards), FLUX.1 and Z-Image between
        doc = copy.deepcopy(body)
        doc["graph"]["nodes"]["3"]["params"]["seed"] = seed
        runs[f"sdxl-{seed}"] = owner.post("/v1/runs", json=doc)
        if seed == SEEDS[0]:
            runs["flux1"] = owner.post("/v1/runs", json=flux_e2e.graph(
                flux["model"], flux["vae"], [flux["text_encoder"], flux["text_encoder_2"]]))
            runs["zimage"] = owner.post("/v1/runs", json=primitive_graph(zimage))
    assert all(r.status_code == 201 for r in runs.values()), {k: r.text for k, r in runs.items()}
    done = {k: owner.wait_run(r.json()["runId"]) for k, r in runs.items()}
    f = flux_e2e
    flux_image = flux_pipeline()(f.PROMPT, width=f.W, height=f.H, num_inference_steps=f.STEPS,
                                 guidance_scale=f.GUIDANCE,
                                 generator=torch.Generator("cpu").manual_seed(f.SEED)).images[0]
    expected = {**{f"sdxl-{s}": sdxl_reference(s) for s in SEEDS},
                "flux1": np.asarray(flux_image.convert("RGB")), "zimage": zimage_reference()}
    for key, run in done.items():
        ours = take_pixels(owner, run)[0].astype(int)
        # within rounding: runs that share a forward batch round a hair apart from solo ones
        assert np.abs(ours - expected[key]).max() <= 1, key
