"""Qwen-Image through /v1 on a real worker: its files as the fleet reports them, a render that
matches diffusers' QwenImagePipeline pixel for pixel, ComfyUI's Qwen-Image workflow (UI format)
imported and rendered as ComfyUI samples it, and runs of several prompts queued together."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
import torch

from tests.apps.importer.builder import Ui
from tests.e2e.test_generation import take_pixels
from tests.livefarm import Client

pytestmark = pytest.mark.e2e

W, H, STEPS, SEED, GUIDANCE = 64, 48, 3, 5, 3.0  # the pipeline's true_cfg_scale: GUIDANCE + 1
CFG, SHIFT = 2.5, 3.1  # ComfyUI's Qwen-Image template: KSampler cfg, ModelSamplingAuraFlow
PROMPT = "a paper boat on a puddle"


@pytest.fixture(scope="module")
def qwen(farm, data_dirs, personas) -> dict[str, str]:
    """The tiny Qwen-Image stack in the worker's models dir, once its heartbeat reports it."""
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


def graph(names: dict[str, str], *, seed: int = SEED, prompt: str = PROMPT) -> dict[str, Any]:
    def wire(node: str, port: str) -> dict[str, str]:
        return {"node": node, "port": port}

    return {"graph": {"nodes": {
        "unet": {"type": "load/diffusion-model", "params": {"file": names["model"]}},
        "vae": {"type": "load/vae", "params": {"file": names["vae"]}},
        "te": {"type": "load/text-encoder", "params": {"file": names["text_encoder"]}},
        "pos": {"type": "encode/text", "params": {"text": prompt},
                "inputs": {"encoder": wire("te", "encoder")}},
        "empty": {"type": "latent/empty", "params": {"width": W, "height": H}},
        "sample": {"type": "sample", "params": {"steps": STEPS, "seed": seed, "guidance": GUIDANCE},
                   "inputs": {"model": wire("unet", "model"), "positive": wire("pos", "conditioning"),
                              "latent": wire("empty", "latent")}},
        "decode": {"type": "vae/decode", "inputs": {"vae": wire("vae", "vae"),
                                                    "latent": wire("sample", "latent")}},
        "out": {"type": "image/save", "inputs": {"image": wire("decode", "image")}},
    }}, "target": "out"}


def pipeline_pixels(seed: int = SEED, prompt: str = PROMPT) -> np.ndarray:
    from workers.models.qwenimage.tiny import smoke_pipeline

    theirs = smoke_pipeline()(prompt, negative_prompt="", true_cfg_scale=GUIDANCE + 1.0, width=W,
                              height=H, num_inference_steps=STEPS,
                              generator=torch.Generator("cpu").manual_seed(seed)).images[0]
    return np.asarray(theirs.convert("RGB"))


def test_the_fleet_reports_each_qwen_image_file_s_family_and_role(owner, qwen):
    files = {f["name"]: f for f in owner.get("/v1/models/files").json()["files"]}
    for key, role in (("model", "transformer"), ("vae", "vae"), ("text_encoder", "text_encoder")):
        assert (files[qwen[key]]["family"], files[qwen[key]]["role"]) == ("qwenimage", role)
    workers = owner.get("/v1/workers").json()["items"]
    assert any("qwenimage" in w["families"] for w in workers)


def test_queued_qwen_image_runs_render_what_the_pipeline_renders(owner, qwen):
    """Three runs of other prompts and seeds queued at once (they may share forwards and text
    encodes, their prompts padded under the mask): each is the pipeline's image within
    rounding; a run alone (a prompt and seed none of them used: no cached node, such as
    a text encode shared with them, answers it) is it exactly."""
    runs = [(SEED, PROMPT), (SEED + 1, "a kite"), (SEED + 2, f"{PROMPT} at noon, wide angle")]
    posted = [owner.post("/v1/runs", json=graph(qwen, seed=s, prompt=p)) for s, p in runs]
    assert all(r.status_code == 201 for r in posted), [r.text for r in posted]
    for (seed, prompt), response in zip(runs, posted, strict=True):
        ours = take_pixels(owner, owner.wait_run(response.json()["runId"]))[0].astype(int)
        assert np.abs(ours - pipeline_pixels(seed, prompt)).max() <= 1, seed
    seed, prompt = SEED + 3, "a lantern in the fog"
    alone = owner.post("/v1/runs", json=graph(qwen, seed=seed, prompt=prompt)).json()["runId"]
    assert np.array_equal(take_pixels(owner, owner.wait_run(alone))[0],
                          pipeline_pixels(seed, prompt))


def qwen_image_ui(qwen: dict[str, str]) -> dict[str, Any]:
    """Qwen-Image as ComfyUI's editor saves its template: UNETLoader, CLIPLoader (type
    qwen_image), VAELoader, ModelSamplingAuraFlow, a prompt and an empty negative,
    EmptySD3LatentImage, KSampler (euler, simple), VAEDecode, SaveImage."""
    ui = Ui()
    ui.add(37, "UNETLoader", [qwen["model"], "default"], outputs=["MODEL"])
    ui.add(38, "CLIPLoader", [qwen["text_encoder"], "qwen_image", "default"], outputs=["CLIP"])
    ui.add(39, "VAELoader", [qwen["vae"]], outputs=["VAE"])
    ui.add(66, "ModelSamplingAuraFlow", [SHIFT], inputs=[("model", "MODEL")], outputs=["MODEL"])
    ui.add(6, "CLIPTextEncode", [PROMPT], inputs=[("clip", "CLIP")], outputs=["CONDITIONING"])
    ui.add(7, "CLIPTextEncode", [""], inputs=[("clip", "CLIP")], outputs=["CONDITIONING"])
    ui.add(58, "EmptySD3LatentImage", [W, H, 1], outputs=["LATENT"])
    ui.add(3, "KSampler", [SEED, "fixed", STEPS, CFG, "euler", "simple", 1.0],
           inputs=[("model", "MODEL"), ("positive", "CONDITIONING"),
                   ("negative", "CONDITIONING"), ("latent_image", "LATENT")], outputs=["LATENT"])
    ui.add(8, "VAEDecode", [], inputs=[("samples", "LATENT"), ("vae", "VAE")], outputs=["IMAGE"])
    ui.add(60, "SaveImage", ["qwen-image"], inputs=[("images", "IMAGE")])
    (ui.link(37, 0, 66, "model").link(38, 0, 6, "clip").link(38, 0, 7, "clip")
       .link(66, 0, 3, "model").link(6, 0, 3, "positive").link(7, 0, 3, "negative")
       .link(58, 0, 3, "latent_image").link(3, 0, 8, "samples").link(39, 0, 8, "vae")
       .link(8, 0, 60, "images"))
    return ui.doc()


def comfy_pixels() -> np.ndarray:
    """What ComfyUI's euler / simple renders for the template: its euler
    (tests/workers/comfy_reference.py) over AuraFlow's shifted sigmas, cfg 2.5 with the family's
    guidance (the pipeline's norm-rescaled CFG), on the smoke pipeline's transformer, from the
    farm's seeded noise, decoded by its VAE."""
    from tests.workers import comfy_reference as ref
    from workers.device.policy import Placement
    from workers.models.qwenimage import LATENT, engine, plugin
    from workers.models.qwenimage.tiny import smoke_pipeline
    from workers.models.values import TextEncoder, Vae
    from workers.runners.diffusion import noise
    from workers.sampling import SampleJob
    from workers.sampling.schedulers import calculate_sigmas

    pipe, cpu = smoke_pipeline(), Placement("cpu", "float32")
    encoder = TextEncoder("", "", pipe.text_encoder, pipe.tokenizer, cpu)
    positive, negative = (engine.encode_prompts(encoder, [t])[0] for t in (PROMPT, ""))
    ms = plugin.model_sampling(W, H, shift=SHIFT)
    sigmas = calculate_sigmas(ms, "simple", STEPS)

    def model(x: Any, sigma: Any) -> Any:
        sigma = sigma.reshape(()).float()
        job = SampleJob(x, torch.stack([sigma, torch.tensor(0.0)]), ms.timestep(sigma).reshape(1),
                        positive, negative=negative, guidance=CFG - 1)
        return plugin.to_denoised(job, engine.predict(pipe.transformer, [job])[0])

    eps = noise(LATENT.shape(W, H), torch.Generator("cpu").manual_seed(SEED), "cpu")
    start = ms.noise_scaling(sigmas[0], eps, torch.zeros(1), True)
    with torch.no_grad():
        x = ref.REFERENCE["euler"](model, start, sigmas, ms, ref.default_noise_sampler(start, SEED))
        image = engine.decode_latents_batch(Vae("", "", pipe.vae, cpu), [x])[0]
    return np.asarray(image.convert("RGB"))


def test_comfyuis_qwen_image_workflow_in_ui_format_imports_and_renders_as_comfyui_does(owner,
                                                                                      qwen):
    response = owner.post("/v1/import/comfy", json=qwen_image_ui(qwen))
    assert response.status_code == 200, response.text
    imported = response.json()
    report = imported["report"]
    assert not report["unmapped"] and not report["warnings"], report
    assert {m["name"] for m in report["models"] if m["held"]} == set(qwen.values())
    sampler = imported["graph"]["nodes"]["3"]["params"]
    assert (sampler["guidance"], sampler["shift"], sampler["sampler"], sampler["scheduler"]) == (
        CFG - 1, SHIFT, "euler", "simple")
    run = owner.wait_run(owner.post("/v1/runs", json={"graph": imported["graph"],
                                                      "target": imported["target"]}).json()["runId"])
    ours = take_pixels(owner, run)[0].astype(int)
    assert np.abs(ours - comfy_pixels()).max() <= 1
