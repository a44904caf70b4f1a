"""FLUX.2 Klein through /v1 on a real worker: its files as the fleet reports them, runs with and
without CFG queued together, editing with uploaded reference images, and ComfyUI's Klein
workflows (text-to-image and edit, UI format) imported onto the smoke stack, each the pixels of
diffusers' Flux2KleinPipeline."""

from __future__ import annotations

import io
import json
import time
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from tests.apps.importer.test_flux2_mapping import klein_ui
from tests.conftest import upload
from tests.e2e.test_flux1 import rendered
from tests.e2e.test_generation import take_pixels
from tests.livefarm import Client

pytestmark = pytest.mark.e2e

W, H, STEPS = 64, 48, 3
PROMPT = "a glasshouse in the snow"


@pytest.fixture(scope="module")
def flux2(farm, data_dirs, personas) -> dict[str, str]:
    return flux2_stack_reported(farm, data_dirs, personas)


def flux2_stack_reported(farm, data_dirs, personas) -> dict[str, str]:
    """The tiny FLUX.2 Klein stack in the worker's models dir, once its heartbeat reports it."""
    from workers.models.flux2.tiny import write_smoke_stack

    names = write_smoke_stack(data_dirs["models"])
    deadline = time.monotonic() + 30
    with Client(base_url=farm.url, headers={"Authorization": f"Bearer {personas['owner']}"},
                timeout=30) as client:
        while time.monotonic() < deadline:
            files = client.get("/v1/models/files?family=flux2").json()["files"]
            if set(names.values()) <= {f["name"] for f in files}:
                return names
            time.sleep(0.2)
    raise AssertionError("no worker reported the FLUX.2 smoke stack")


def graph(names: dict[str, str], *, seed: int, guidance: float) -> dict[str, Any]:
    def wire(node: str, port: str) -> dict[str, str]:
        return {"node": node, "port": port}

    return {"graph": {"nodes": {
        "unet": {"type": "load/diffusion-model", "params": {"file": names["model"]}},
        "vae": {"type": "load/vae", "params": {"file": names["vae"]}},
        "te": {"type": "load/text-encoder",
               "params": {"file": names["text_encoder"], "family": "flux2"}},
        "pos": {"type": "encode/text", "params": {"text": PROMPT},
                "inputs": {"encoder": wire("te", "encoder")}},
        "empty": {"type": "latent/empty", "params": {"width": W, "height": H}},
        "sample": {"type": "sample", "params": {"steps": STEPS, "seed": seed, "guidance": guidance},
                   "inputs": {"model": wire("unet", "model"), "positive": wire("pos", "conditioning"),
                              "latent": wire("empty", "latent")}},
        "decode": {"type": "vae/decode", "inputs": {"vae": wire("vae", "vae"),
                                                    "latent": wire("sample", "latent")}},
        "out": {"type": "image/save", "inputs": {"image": wire("decode", "image")}},
    }}, "target": "out"}


def klein_reference(seed: int, guidance: float, images: tuple[Image.Image, ...] = ()) -> np.ndarray:
    """Flux2KleinPipeline on the same tiny weights (its scale is the farm's guidance + 1)."""
    from workers.models.flux2.tiny import smoke_pipeline

    image = smoke_pipeline()(prompt=PROMPT, width=W, height=H, num_inference_steps=STEPS,
                             guidance_scale=guidance + 1.0, image=list(images) or None,
                             generator=torch.Generator("cpu").manual_seed(seed)).images[0]
    return np.asarray(image.convert("RGB"))


def uploaded(owner: Client, seed: int, width: int, height: int) -> tuple[str, Image.Image]:
    """A random RGB image uploaded as an asset: (its id, the image)."""
    image = Image.fromarray(np.random.default_rng(seed).integers(0, 255, (height, width, 3),
                                                                 dtype=np.uint8))
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return upload(owner, buf.getvalue()).json()["id"], image


def test_the_fleet_reports_each_flux2_file_s_family_and_role(owner, flux2):
    files = {f["name"]: f for f in owner.get("/v1/models/files").json()["files"]}
    assert (files[flux2["model"]]["family"], files[flux2["model"]]["role"]) == (
        "flux2", "transformer")
    assert (files[flux2["vae"]]["family"], files[flux2["vae"]]["role"]) == ("flux2", "vae")
    assert files[flux2["text_encoder"]]["families"] == ["zimage", "flux2"]
    workers = owner.get("/v1/workers").json()["items"]
    assert any("flux2" in w["families"] for w in workers)


def test_a_klein_render_is_the_pipelines_pixels(owner, flux2):
    ours = rendered(owner, graph(flux2, seed=5, guidance=0.0))
    assert np.array_equal(ours, klein_reference(5, 0.0))


def test_klein_runs_with_and_without_cfg_queued_together_each_render_their_reference(owner, flux2):
    cases = {(seed, guidance) for seed in (1, 2) for guidance in (0.0, 2.0)}
    runs = {case: owner.post("/v1/runs", json=graph(flux2, seed=case[0], guidance=case[1]))
            for case in cases}
    assert all(r.status_code == 201 for r in runs.values()), {k: r.text for k, r in runs.items()}
    for (seed, guidance), response in runs.items():
        run = owner.wait_run(response.json()["runId"])
        assert run["status"] == "succeeded", run
        ours = take_pixels(owner, run)[0].astype(int)
        # within rounding: runs that share a forward batch round a hair apart from solo ones
        assert np.abs(ours - klein_reference(seed, guidance)).max() <= 1, (seed, guidance)


@pytest.mark.parametrize("cfg", [1.0, 3.0])
def test_comfyui_s_klein_workflow_imports_and_renders_the_pipelines_pixels(owner, flux2, cfg):
    """CLIPLoader type flux2, EmptyFlux2LatentImage, Flux2Scheduler, CFGGuider, euler: ComfyUI's
    cfg is the pipeline's guidance_scale (cfg 1: no CFG)."""
    doc = klein_ui(model=flux2["model"], vae=flux2["vae"], encoder=flux2["text_encoder"],
                   prompt=PROMPT, width=W, height=H, steps=STEPS, cfg=cfg, seed=9).doc()
    response = owner.post("/v1/import/comfy", content=json.dumps(doc).encode(),
                          headers={"Content-Type": "application/json"})
    assert response.status_code == 200, response.text
    body = {"graph": response.json()["graph"], "target": response.json()["target"]}
    ours = rendered(owner, body).astype(int)
    # the generic euler steps on x0 = x − σ·v: the pipeline's Euler within float rounding
    assert np.abs(ours - klein_reference(9, cfg - 1.0)).max() <= 1


def test_editing_with_two_uploaded_references_renders_the_pipelines_pixels(owner, flux2):
    (first, image_a), (second, image_b) = uploaded(owner, 1, 64, 64), uploaded(owner, 2, 100, 70)
    body = graph(flux2, seed=4, guidance=2.0)
    nodes = body["graph"]["nodes"]
    nodes["a"] = {"type": "image/load", "params": {"asset": first}}
    nodes["b"] = {"type": "image/load", "params": {"asset": second}}
    nodes["edit"] = {"type": "flux2/reference", "inputs": {
        "conditioning": {"node": "pos", "port": "conditioning"}, "vae": {"node": "vae", "port": "vae"},
        "image": {"node": "a", "port": "image"}, "image_2": {"node": "b", "port": "image"}}}
    nodes["sample"]["inputs"]["positive"] = {"node": "edit", "port": "conditioning"}
    ours = rendered(owner, body).astype(int)
    # CFG's rows share a forward: within a level of the pipeline's apart ones (test_flux2 workers)
    assert np.abs(ours - klein_reference(4, 2.0, (image_a, image_b))).max() <= 1


def test_comfyui_s_klein_edit_workflow_imports_and_renders_the_pipelines_pixels(owner, flux2):
    asset, image = uploaded(owner, 3, 64, 64)
    doc = klein_ui(model=flux2["model"], vae=flux2["vae"], encoder=flux2["text_encoder"],
                   prompt=PROMPT, width=W, height=H, steps=STEPS, cfg=3.0, seed=6,
                   reference="reference.png").doc()
    response = owner.post("/v1/import/comfy", content=json.dumps(doc).encode(),
                          headers={"Content-Type": "application/json"})
    assert response.status_code == 200, response.text
    body = {"graph": response.json()["graph"], "target": response.json()["target"]}
    body["graph"]["nodes"]["20"]["params"]["asset"] = asset  # the LoadImage, uploaded
    ours = rendered(owner, body).astype(int)
    assert np.abs(ours - klein_reference(6, 2.0, (image,))).max() <= 1
