"""Wan through /v1 on a real worker: text-to-video graphs (video latent → sample → decode-video
→ a frame saved as a still), four runs of other prompts and seeds queued at once share
forwards on one worker (`batch` > 1 in their progress) and each still is WanPipeline's frame
within rounding."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
import torch

from tests.e2e.test_generation import take_pixels
from tests.livefarm import Client

pytestmark = pytest.mark.e2e

W, H, FRAMES, STEPS, GUIDANCE = 48, 32, 5, 12, 5.0
PROMPT = "a paper lantern drifting on a river"


@pytest.fixture(scope="module")
def wan(farm, data_dirs, personas) -> dict[str, str]:
    """The tiny Wan stack in the worker's models dir, once its heartbeat reports it."""
    from workers.models.wan.tiny import write_smoke_stack

    names = write_smoke_stack(data_dirs["models"])
    deadline = time.monotonic() + 30
    with Client(base_url=farm.url, headers={"Authorization": f"Bearer {personas['owner']}"},
                timeout=30) as client:
        while time.monotonic() < deadline:
            files = client.get("/v1/models/files?family=wan").json()["files"]
            if {names["model"], names["text_encoder"]} <= {f["name"] for f in files}:
                return names
            time.sleep(0.2)
    raise AssertionError("no worker reported the Wan smoke stack")


def graph(names: dict[str, str], *, seed: int, prompt: str) -> dict[str, Any]:
    def wire(node: str, port: str) -> dict[str, str]:
        return {"node": node, "port": port}

    return {"graph": {"nodes": {
        "unet": {"type": "load/diffusion-model", "params": {"file": names["model"]}},
        "vae": {"type": "load/vae", "params": {"file": names["vae"]}},
        "te": {"type": "load/text-encoder", "params": {"file": names["text_encoder"],
                                                       "family": "wan"}},
        "pos": {"type": "encode/text", "params": {"text": prompt},
                "inputs": {"encoder": wire("te", "encoder")}},
        "neg": {"type": "encode/text", "params": {"text": ""},
                "inputs": {"encoder": wire("te", "encoder")}},
        "empty": {"type": "latent/empty-video",
                  "params": {"width": W, "height": H, "length": FRAMES, "batch": 1}},
        "sample": {"type": "sample", "params": {"steps": STEPS, "seed": seed, "guidance": GUIDANCE},
                   "inputs": {"model": wire("unet", "model"), "positive": wire("pos", "conditioning"),
                              "negative": wire("neg", "conditioning"),
                              "latent": wire("empty", "latent")}},
        "decode": {"type": "vae/decode-video", "inputs": {"vae": wire("vae", "vae"),
                                                          "latent": wire("sample", "latent")}},
        "still": {"type": "frames/image", "params": {"index": -1},
                  "inputs": {"frames": wire("decode", "frames")}},
        "out": {"type": "image/save", "inputs": {"image": wire("still", "image")}},
    }}, "target": "out"}


def pipeline_frame(seed: int, prompt: str) -> np.ndarray:
    from workers.models.wan.engine import to_uint8
    from workers.models.wan.tiny import smoke_pipeline

    out = smoke_pipeline()(prompt=prompt, negative_prompt="", height=H, width=W,
                           num_frames=FRAMES, num_inference_steps=STEPS,
                           guidance_scale=GUIDANCE, output_type="np",
                           generator=torch.Generator("cpu").manual_seed(seed)).frames
    return to_uint8(np.asarray(out[0]))[-1]


def test_the_fleet_reports_each_wan_file_s_family_and_role(owner, wan):
    files = {f["name"]: f for f in owner.get("/v1/models/files?family=wan").json()["files"]}
    for key in ("model", "model_low", "model_i2v"):
        assert (files[wan[key]]["role"], files[wan[key]]["family"]) == ("transformer", "wan")
    assert files[wan["text_encoder"]]["family"] == "wan"
    assert "wan" in files[wan["vae"]]["families"]


def test_four_queued_wan_runs_share_forwards_and_each_is_the_pipeline_s_clip(owner, wan,
                                                                            db_access):
    from apps.runs.models import RunEvent

    runs = [(11, PROMPT), (12, "a kite"), (13, f"{PROMPT} at noon"), (14, "fog over a pier")]
    posted = [owner.post("/v1/runs", json=graph(wan, seed=s, prompt=p)) for s, p in runs]
    assert all(r.status_code == 201 for r in posted), [r.text for r in posted]
    done = [owner.wait_run(r.json()["runId"], timeout=120) for r in posted]
    progress = [e.payload for run in done
                for e in RunEvent.objects.filter(run_id=run["id"], type="progress")]
    batches = [int(p.get("batch") or 1) for p in progress]
    assert len(batches) == 4 * STEPS and max(batches) > 1, batches
    assert {p.get("frames") for p in progress} == {FRAMES}, "a video run's progress: its frames"
    for (seed, prompt), run in zip(runs, done, strict=True):
        ours = take_pixels(owner, run)[0].astype(int)
        assert ours.shape == (H, W, 3)
        assert np.abs(ours - pipeline_frame(seed, prompt)).max() <= 1, seed


def test_comfyuis_wan22_two_expert_workflow_imports_and_renders_the_pipeline_s_clip(owner, wan):
    """ComfyUI's Wan 2.2 template (API format): two UNETLoaders behind ModelSamplingSD3, the
    `wan` CLIPLoader, EmptyHunyuanLatentVideo, two KSamplerAdvanced (high-noise steps [0, k)
    with leftover noise, low-noise [k, n) without new noise), VAEDecode, one frame saved:
    WanPipeline's clip with transformer_2 switching at the same step."""
    from workers.models.wan.engine import schedule, to_uint8
    from workers.models.wan.tiny import smoke_pipeline

    ratio, seed, prompt = 0.9, 21, "a lighthouse in the rain"
    _, timesteps = schedule(STEPS, W, H)
    high = int((timesteps >= ratio * 1000).sum())
    assert 0 < high < STEPS

    def advanced(model: str, start: int, end: int, noise: str, leftover: str,
                 latent: list[Any]) -> dict[str, Any]:
        return {"class_type": "KSamplerAdvanced", "inputs": {
            "model": [model, 0], "positive": ["7", 0], "negative": ["8", 0],
            "latent_image": latent, "add_noise": noise, "noise_seed": seed, "steps": STEPS,
            "cfg": GUIDANCE, "sampler_name": "euler", "scheduler": "simple",
            "start_at_step": start, "end_at_step": end, "return_with_leftover_noise": leftover}}

    workflow = {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": wan["model"],
                                                     "weight_dtype": "default"}},
        "2": {"class_type": "UNETLoader", "inputs": {"unet_name": wan["model_low"],
                                                     "weight_dtype": "default"}},
        "3": {"class_type": "ModelSamplingSD3", "inputs": {"model": ["1", 0], "shift": 8.0}},
        "4": {"class_type": "ModelSamplingSD3", "inputs": {"model": ["2", 0], "shift": 8.0}},
        "5": {"class_type": "CLIPLoader", "inputs": {"clip_name": wan["text_encoder"],
                                                     "type": "wan", "device": "default"}},
        "6": {"class_type": "VAELoader", "inputs": {"vae_name": wan["vae"]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": prompt, "clip": ["5", 0]}},
        "8": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["5", 0]}},
        "9": {"class_type": "EmptyHunyuanLatentVideo", "inputs": {
            "width": W, "height": H, "length": FRAMES, "batch_size": 1}},
        "10": advanced("3", 0, high, "enable", "enable", ["9", 0]),
        "11": advanced("4", high, 10000, "disable", "disable", ["10", 0]),
        "12": {"class_type": "VAEDecode", "inputs": {"samples": ["11", 0], "vae": ["6", 0]}},
        "13": {"class_type": "ImageFromBatch", "inputs": {"image": ["12", 0],
                                                          "batch_index": FRAMES - 1, "length": 1}},
        "14": {"class_type": "SaveImage", "inputs": {"images": ["13", 0],
                                                     "filename_prefix": "wan22"}},
    }
    response = owner.post("/v1/import/comfy", json=workflow)
    assert response.status_code == 200, response.text
    imported = response.json()
    assert not imported["report"]["unmapped"], imported["report"]
    run = owner.wait_run(owner.post("/v1/runs", json={"graph": imported["graph"],
                                                      "target": imported["target"]}).json()["runId"],
                         timeout=120)
    ours = take_pixels(owner, run)[0].astype(int)
    pipe = smoke_pipeline(experts=True, boundary_ratio=ratio)
    out = pipe(prompt=prompt, negative_prompt="", height=H, width=W, num_frames=FRAMES,
               num_inference_steps=STEPS, guidance_scale=GUIDANCE, output_type="np",
               generator=torch.Generator("cpu").manual_seed(seed)).frames
    assert np.abs(ours - to_uint8(np.asarray(out[0]))[-1].astype(int)).max() <= 1
