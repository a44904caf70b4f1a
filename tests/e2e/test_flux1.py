"""FLUX.1 through /v1 on a real worker: its files as the fleet reports them, a render that
matches diffusers' FluxPipeline pixel for pixel, and a graph mixing families refused at submit."""

from __future__ import annotations

import io
import time
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from tests.apps.importer.builder import Ui
from tests.conftest import smoke_stack_reported
from tests.livefarm import Client

pytestmark = pytest.mark.e2e

W, H, STEPS, SEED, GUIDANCE = 64, 48, 3, 5, 2.5
PROMPT = "a red kite over the dunes"


@pytest.fixture(scope="module")
def flux(farm, data_dirs, personas) -> dict[str, str]:
    """The tiny FLUX.1 stack in the worker's models dir, once its heartbeat reports it."""
    from workers.models.flux1.tiny import write_smoke_stack

    names = write_smoke_stack(data_dirs["models"])
    deadline = time.monotonic() + 30
    with Client(base_url=farm.url, headers={"Authorization": f"Bearer {personas['owner']}"},
                timeout=30) as client:
        while time.monotonic() < deadline:
            files = client.get("/v1/models/files?family=flux1").json()["files"]
            if set(names.values()) <= {f["name"] for f in files}:
                return names
            time.sleep(0.2)
    raise AssertionError("no worker reported the FLUX.1 smoke stack")


@pytest.fixture(scope="module")
def zimage(farm, data_dirs, personas) -> dict[str, str]:
    return smoke_stack_reported(farm, personas["owner"], data_dirs["models"])


def graph(model: str, vae: str, encoders: list[str]) -> dict[str, Any]:
    def wire(node: str, port: str) -> dict[str, str]:
        return {"node": node, "port": port}

    files = {"file": encoders[0], **({"file_2": encoders[1]} if len(encoders) > 1 else {})}
    return {"graph": {"nodes": {
        "unet": {"type": "load/diffusion-model", "params": {"file": model}},
        "vae": {"type": "load/vae", "params": {"file": vae}},
        "te": {"type": "load/text-encoder", "params": files},
        "pos": {"type": "encode/text", "params": {"text": PROMPT},
                "inputs": {"encoder": wire("te", "encoder")}},
        "empty": {"type": "latent/empty", "params": {"width": W, "height": H}},
        "sample": {"type": "sample", "params": {"steps": STEPS, "seed": SEED, "guidance": GUIDANCE},
                   "inputs": {"model": wire("unet", "model"), "positive": wire("pos", "conditioning"),
                              "latent": wire("empty", "latent")}},
        "decode": {"type": "vae/decode", "inputs": {"vae": wire("vae", "vae"),
                                                    "latent": wire("sample", "latent")}},
        "out": {"type": "image/save", "inputs": {"image": wire("decode", "image")}},
    }}, "target": "out"}


def test_the_fleet_reports_each_flux_file_s_family_and_role(owner, flux):
    files = {f["name"]: f for f in owner.get("/v1/models/files").json()["files"]}
    assert (files[flux["model"]]["family"], files[flux["model"]]["role"]) == ("flux1", "transformer")
    assert files[flux["text_encoder_2"]]["role"] == "text_encoder"
    workers = owner.get("/v1/workers").json()["items"]
    assert any("flux1" in w["families"] for w in workers)


def rendered(owner: Client, body: dict[str, Any]) -> np.ndarray:
    run = owner.wait_run(owner.post("/v1/runs", json=body).json()["runId"])
    assert run["status"] == "succeeded", run
    data = owner.get(f"/v1/takes/{run['takes'][0]['id']}/bytes").content
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def flux_pipeline_pixels() -> np.ndarray:
    from workers.models.flux1.tiny import smoke_pipeline

    theirs = smoke_pipeline()(PROMPT, width=W, height=H, num_inference_steps=STEPS,
                              guidance_scale=GUIDANCE,
                              generator=torch.Generator("cpu").manual_seed(SEED)).images[0]
    return np.asarray(theirs.convert("RGB"))


def test_a_flux_graph_renders_what_flux_pipeline_renders(owner, flux):
    body = graph(flux["model"], flux["vae"], [flux["text_encoder_2"], flux["text_encoder"]])
    assert np.array_equal(rendered(owner, body), flux_pipeline_pixels())


def flux_dev_ui(flux: dict[str, str]) -> dict[str, Any]:
    """FLUX.1 dev as ComfyUI's editor saves it: UNETLoader, DualCLIPLoader (type flux),
    VAELoader; the prompt through FluxGuidance; KSampler at cfg 1 with its negative zeroed
    out; EmptySD3LatentImage; VAEDecode; SaveImage."""
    ui = Ui()
    ui.add(1, "UNETLoader", [flux["model"], "default"], outputs=["MODEL"])
    ui.add(2, "DualCLIPLoader", [flux["text_encoder"], flux["text_encoder_2"], "flux", "default"],
           outputs=["CLIP"])
    ui.add(3, "VAELoader", [flux["vae"]], outputs=["VAE"])
    ui.add(4, "CLIPTextEncode", [PROMPT], inputs=[("clip", "CLIP")], outputs=["CONDITIONING"])
    ui.add(5, "FluxGuidance", [GUIDANCE], inputs=[("conditioning", "CONDITIONING")],
           outputs=["CONDITIONING"])
    ui.add(6, "ConditioningZeroOut", [], inputs=[("conditioning", "CONDITIONING")],
           outputs=["CONDITIONING"])
    ui.add(7, "EmptySD3LatentImage", [W, H, 1], outputs=["LATENT"])
    ui.add(8, "KSampler", [SEED, "fixed", STEPS, 1.0, "euler", "simple", 1.0],
           inputs=[("model", "MODEL"), ("positive", "CONDITIONING"),
                   ("negative", "CONDITIONING"), ("latent_image", "LATENT")], outputs=["LATENT"])
    ui.add(9, "VAEDecode", [], inputs=[("samples", "LATENT"), ("vae", "VAE")], outputs=["IMAGE"])
    ui.add(10, "SaveImage", ["flux-dev"], inputs=[("images", "IMAGE")])
    (ui.link(2, 0, 4, "clip").link(4, 0, 5, "conditioning").link(4, 0, 6, "conditioning")
       .link(1, 0, 8, "model").link(5, 0, 8, "positive").link(6, 0, 8, "negative")
       .link(7, 0, 8, "latent_image").link(8, 0, 9, "samples").link(3, 0, 9, "vae")
       .link(9, 0, 10, "images"))
    return ui.doc()


def flux_comfy_pixels(sampler: str, scheduler: str) -> np.ndarray:
    """What ComfyUI renders for a FLUX.1 KSampler: its `sampler` (tests/workers/comfy_reference.py)
    over ModelSamplingFlux's `scheduler` sigmas, FluxGuidance's guidance, on the smoke
    pipeline's transformer, from the farm's seeded noise, decoded by its VAE."""
    from tests.workers import comfy_reference as ref
    from workers.device.policy import Placement
    from workers.models.flux1 import LATENT, engine, plugin
    from workers.models.flux1.tiny import smoke_pipeline
    from workers.models.values import TextEncoder, Vae
    from workers.runners.diffusion import noise
    from workers.sampling import SampleJob
    from workers.sampling.schedulers import calculate_sigmas

    pipe, cpu = smoke_pipeline(), Placement("cpu", "float32")
    encoder = TextEncoder("", "", (pipe.text_encoder, pipe.text_encoder_2),
                          (pipe.tokenizer, pipe.tokenizer_2), cpu)
    [positive] = engine.encode_prompts(encoder, [PROMPT])
    ms = plugin.model_sampling(W, H)
    sigmas = calculate_sigmas(ms, scheduler, STEPS)

    def model(x: Any, sigma: Any) -> Any:
        sigma = sigma.reshape(()).float()
        job = SampleJob(x, torch.stack([sigma, torch.tensor(0.0)]),
                        ms.timestep(sigma).reshape(1), positive,
                        extra={"guidance": GUIDANCE})
        return plugin.to_denoised(job, engine.predict(pipe.transformer, [job])[0])

    eps = noise(LATENT.shape(W, H), torch.Generator("cpu").manual_seed(SEED), "cpu")
    start = ms.noise_scaling(sigmas[0], eps, torch.zeros(1), True)
    with torch.no_grad():
        x = ref.REFERENCE[sampler](model, start, sigmas, ms, ref.default_noise_sampler(start, SEED))
        image = engine.decode_latents_batch(Vae("", "", pipe.vae, cpu), [x])[0]
    return np.asarray(image.convert("RGB"))


def test_a_flux_dev_workflow_in_comfyuis_ui_format_imports_and_renders_as_comfyui_does(
        owner, flux):
    """Its KSampler's euler / simple are ComfyUI's (the generic sampler over ModelSamplingFlux's
    table), which differ from FluxPipeline's own sigmas by the table's rounding."""
    response = owner.post("/v1/import/comfy", json=flux_dev_ui(flux))
    assert response.status_code == 200, response.text
    imported = response.json()
    sampler = imported["graph"]["nodes"]["8"]
    assert (sampler["params"]["guidance"], sampler["params"]["shift"]) == (GUIDANCE, None)
    report = imported["report"]
    assert not report["unmapped"] and not report["warnings"], report
    assert {m["name"] for m in report["models"] if m["held"]} == set(flux.values())
    body = {"graph": imported["graph"], "target": imported["target"]}
    assert (sampler["params"]["sampler"], sampler["params"]["scheduler"]) == ("euler", "simple")
    ours = rendered(owner, body).astype(int)
    assert np.abs(ours - flux_comfy_pixels("euler", "simple")).max() <= 1


def test_a_flux_transformer_with_z_image_s_encoder_is_a_422_naming_the_node(owner, flux, zimage):
    body = graph(flux["model"], flux["vae"], [zimage["text_encoder"]])
    response = owner.post("/v1/runs", json=body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert (error["code"], error["nodeId"]) == ("family_mismatch", "sample")
    assert "flux1" in error["message"] and "zimage" in error["message"]
