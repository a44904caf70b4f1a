"""Qwen-Image-Edit through /v1 on a real worker: edits of uploaded reference images (one and
two, queued together: other reference counts sample apart) render the edit pipeline's pixels,
and ComfyUI's Qwen-Image-Edit-2509 workflow with two reference images (UI format) imports and
renders on the smoke stack.

The pipelines size reference latents to ~1 MP; on CPU that costs tens of seconds per image, so
the graphs here ask for a smaller area (the node's `megapixels`) and the pipeline's constant is
patched to the same area (tests/workers/test_qwenimage_edit.py)."""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from tests.apps.importer.builder import Ui
from tests.e2e.test_flux2 import uploaded
from tests.e2e.test_generation import take_pixels
from tests.livefarm import Client

pytestmark = pytest.mark.e2e

W, H, STEPS, SEED = 32, 32, 2, 3
AREA = 64 * 64  # the reference latents' images (the pipelines': 1024²)
MEGAPIXELS = AREA / (1024 * 1024)
PROMPT = "paint the boat red"


@pytest.fixture(scope="module")
def qwen(farm, data_dirs, personas) -> dict[str, str]:
    """The tiny Qwen-Image stack (with its Qwen2-VL processor) in the worker's models dir, once
    its heartbeat reports it."""
    from workers.models.qwenimage.tiny import write_smoke_stack

    names = write_smoke_stack(data_dirs["models"])
    deadline = time.monotonic() + 30
    with Client(base_url=farm.url, headers={"Authorization": f"Bearer {personas['owner']}"},
                timeout=30) as client:
        while time.monotonic() < deadline:
            files = client.get("/v1/models/files?family=qwenimage").json()["files"]
            if set(names.values()) <= {f["name"] for f in files}:
                return names
            time.sleep(0.2)
    raise AssertionError("no worker reported the Qwen-Image smoke stack")


def wire(node: str, port: str) -> dict[str, str]:
    return {"node": node, "port": port}


def edit_graph(names: dict[str, str], assets: list[str]) -> dict[str, Any]:
    """Uploaded images → qwenimage/edit (Edit Plus, VAE wired) → sample (no CFG) → save."""
    nodes: dict[str, Any] = {
        "unet": {"type": "load/diffusion-model", "params": {"file": names["model"]}},
        "vae": {"type": "load/vae", "params": {"file": names["vae"]}},
        "te": {"type": "load/text-encoder", "params": {"file": names["text_encoder"]}},
        "edit": {"type": "qwenimage/edit",
                 "params": {"text": PROMPT, "variant": "plus", "megapixels": MEGAPIXELS},
                 "inputs": {"encoder": wire("te", "encoder"), "vae": wire("vae", "vae")}},
        "empty": {"type": "latent/empty", "params": {"width": W, "height": H}},
        "sample": {"type": "sample", "params": {"steps": STEPS, "seed": SEED, "guidance": 0.0},
                   "inputs": {"model": wire("unet", "model"), "positive": wire("edit", "conditioning"),
                              "latent": wire("empty", "latent")}},
        "decode": {"type": "vae/decode", "inputs": {"vae": wire("vae", "vae"),
                                                    "latent": wire("sample", "latent")}},
        "out": {"type": "image/save", "inputs": {"image": wire("decode", "image")}},
    }
    for index, asset in enumerate(assets):
        port = "image" if index == 0 else f"image_{index + 1}"
        nodes[f"ref{index}"] = {"type": "image/load", "params": {"asset": asset}}
        nodes["edit"]["inputs"][port] = wire(f"ref{index}", "image")
    return {"graph": {"nodes": nodes}, "target": "out"}


def pipeline_pixels(monkeypatch: pytest.MonkeyPatch, images: list[Image.Image]) -> np.ndarray:
    """QwenImageEditPlusPipeline on the same tiny weights at the same reference area."""
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit_plus as plus

    from workers.models.qwenimage.tiny import smoke_edit_pipeline

    monkeypatch.setattr(plus, "VAE_IMAGE_SIZE", AREA)
    image = smoke_edit_pipeline("plus")(
        image=images, prompt=PROMPT, true_cfg_scale=1.0, height=H, width=W,
        num_inference_steps=STEPS, generator=torch.Generator("cpu").manual_seed(SEED)).images[0]
    return np.asarray(image.convert("RGB"))


def test_edits_of_one_and_two_uploaded_images_queued_together_render_the_pipelines_pixels(
        owner, qwen, monkeypatch):
    (first, image_a), (second, image_b) = uploaded(owner, 11, 80, 48), uploaded(owner, 12, 48, 64)
    cases = {1: [first], 2: [first, second]}
    runs = {n: owner.post("/v1/runs", json=edit_graph(qwen, assets)) for n, assets in cases.items()}
    assert all(r.status_code == 201 for r in runs.values()), {n: r.text for n, r in runs.items()}
    for n, response in runs.items():
        run = owner.wait_run(response.json()["runId"])
        assert run["status"] == "succeeded", run
        ours = take_pixels(owner, run)[0]
        # other reference counts never share a forward: each is the pipeline's, to the bit
        assert np.array_equal(ours, pipeline_pixels(monkeypatch, [image_a, image_b][:n])), n


def edit_plus_ui(qwen: dict[str, str]) -> dict[str, Any]:
    """ComfyUI's Qwen-Image-Edit-2509 template as its editor saves it: two LoadImage, the
    prompt and the negative as TextEncodeQwenImageEditPlus (CLIP, VAE, image1, image2),
    FluxKontextImageScale on the first image → VAEEncode for the latent, CFGNorm,
    ModelSamplingAuraFlow, KSampler, VAEDecode, SaveImage."""
    ui = Ui()
    ui.add(37, "UNETLoader", [qwen["model"], "default"], outputs=["MODEL"])
    ui.add(38, "CLIPLoader", [qwen["text_encoder"], "qwen_image", "default"], outputs=["CLIP"])
    ui.add(39, "VAELoader", [qwen["vae"]], outputs=["VAE"])
    ui.add(66, "ModelSamplingAuraFlow", [3.0], inputs=[("model", "MODEL")], outputs=["MODEL"])
    ui.add(75, "CFGNorm", [1.0], inputs=[("model", "MODEL")], outputs=["MODEL"])
    ui.add(78, "LoadImage", ["first.png", "image"], outputs=["IMAGE", "MASK"])
    ui.add(79, "LoadImage", ["second.png", "image"], outputs=["IMAGE", "MASK"])
    ui.add(93, "FluxKontextImageScale", [], inputs=[("image", "IMAGE")], outputs=["IMAGE"])
    for node_id, text in ((111, PROMPT), (110, "")):
        ui.add(node_id, "TextEncodeQwenImageEditPlus", [text],
               inputs=[("clip", "CLIP"), ("vae", "VAE"), ("image1", "IMAGE"),
                       ("image2", "IMAGE"), ("image3", "IMAGE")], outputs=["CONDITIONING"])
        (ui.link(38, 0, node_id, "clip").link(39, 0, node_id, "vae")
           .link(93, 0, node_id, "image1").link(79, 0, node_id, "image2"))
    ui.add(88, "VAEEncode", [], inputs=[("pixels", "IMAGE"), ("vae", "VAE")], outputs=["LATENT"])
    ui.add(3, "KSampler", [SEED, "fixed", STEPS, 2.5, "euler", "simple", 1.0],
           inputs=[("model", "MODEL"), ("positive", "CONDITIONING"),
                   ("negative", "CONDITIONING"), ("latent_image", "LATENT")], outputs=["LATENT"])
    ui.add(8, "VAEDecode", [], inputs=[("samples", "LATENT"), ("vae", "VAE")], outputs=["IMAGE"])
    ui.add(60, "SaveImage", ["qwen-edit"], inputs=[("images", "IMAGE")])
    (ui.link(37, 0, 66, "model").link(66, 0, 75, "model").link(75, 0, 3, "model")
       .link(78, 0, 93, "image").link(93, 0, 88, "pixels").link(39, 0, 88, "vae")
       .link(111, 0, 3, "positive").link(110, 0, 3, "negative").link(88, 0, 3, "latent_image")
       .link(3, 0, 8, "samples").link(39, 0, 8, "vae").link(8, 0, 60, "images"))
    return ui.doc()


def test_comfyui_s_edit_plus_workflow_with_two_references_imports_and_renders(owner, qwen):
    first, _ = uploaded(owner, 13, 64, 48)
    second, _ = uploaded(owner, 14, 48, 48)
    response = owner.post("/v1/import/comfy", content=json.dumps(edit_plus_ui(qwen)).encode(),
                          headers={"Content-Type": "application/json"})
    assert response.status_code == 200, response.text
    report, graph = response.json()["report"], response.json()["graph"]
    assert not report["unmapped"], report
    nodes = graph["nodes"]
    for node_id, text in (("111", PROMPT), ("110", "")):
        edit = nodes[node_id]
        assert edit["type"] == "qwenimage/edit"
        assert (edit["params"]["text"], edit["params"]["variant"]) == (text, "plus")
        assert set(edit["inputs"]) == {"encoder", "vae", "image", "image_2"}
        edit["params"]["megapixels"] = MEGAPIXELS  # CPU time: see the module docstring
    assert nodes["93"]["type"] == "image/scale-to-kontext"  # ~1 MP: too big for CPU time,
    nodes["93"] |= {"type": "image/scale-to-pixels",  # so the latent is sized at 0.01 MP
                    "params": {"megapixels": 0.01, "resolution_steps": 16, "method": "lanczos"}}
    nodes["78"]["params"]["asset"], nodes["79"]["params"]["asset"] = first, second
    submitted = owner.post("/v1/runs", json={"graph": graph, "target": response.json()["target"]})
    assert submitted.status_code == 201, submitted.text
    run = owner.wait_run(submitted.json()["runId"])
    assert run["status"] == "succeeded", run
    pixels = take_pixels(owner, run)[0]
    assert pixels.shape == (96, 112, 3)  # ~0.01 MP at 64:48, multiples of 16
    assert pixels.std() > 0
