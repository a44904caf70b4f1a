"""Z-Image Turbo through /v1 on a real worker, against diffusers' pipelines called directly.

The tests write the tiny random-weight stack into the worker's models dir in the ComfyUI layout
(single-file transformer with original keys + config, VAE file, text-encoder folder).
"""

from __future__ import annotations

import io
import time

import numpy as np
import pytest
import torch
from PIL import Image

from tests.conftest import smoke_stack_reported, upload, wait_status

pytestmark = pytest.mark.e2e

W, H, STEPS, SEED = 64, 48, 4, 11
PROMPT = "a lighthouse at dusk, oil painting"


@pytest.fixture(scope="module")
def stack(farm, data_dirs, personas):
    return smoke_stack_reported(farm, personas["owner"], data_dirs["models"])


def turbo_graph(stack, *, image_asset=None, **params):
    node = {"type": "zimage/turbo", "params": {
        "prompt": PROMPT, "width": W, "height": H, "steps": STEPS, "seed": SEED,
        "model": stack["model"], "vae": stack["vae"], "text_encoder": stack["text_encoder"],
        **params}}
    nodes = {"gen": node,
             "out": {"type": "image/save", "inputs": {"image": {"node": "gen", "port": "image"}}}}
    if image_asset:
        nodes["init"] = {"type": "image/load", "params": {"asset": image_asset}}
        node["inputs"] = {"image": {"node": "init", "port": "image"}}
    return {"graph": {"nodes": nodes}, "target": "out"}


def primitive_graph(stack, *, seed=SEED):
    def wire(node, port):
        return {"node": node, "port": port}

    return {"graph": {"nodes": {
        "unet": {"type": "load/diffusion-model", "params": {"file": stack["model"]}},
        "vae": {"type": "load/vae", "params": {"file": stack["vae"]}},
        "te": {"type": "load/text-encoder", "params": {"file": stack["text_encoder"]}},
        "prompt": {"type": "input/text", "params": {"value": PROMPT}},
        "seed": {"type": "input/int", "params": {"value": seed}},
        "pos": {"type": "encode/text", "inputs": {"encoder": wire("te", "encoder"),
                                                  "text": wire("prompt", "text")}},
        "empty": {"type": "latent/empty", "params": {"width": W, "height": H}},
        "sample": {"type": "sample", "params": {"steps": STEPS},
                   "inputs": {"model": wire("unet", "model"), "positive": wire("pos", "conditioning"),
                              "latent": wire("empty", "latent"), "seed": wire("seed", "value")}},
        "decode": {"type": "vae/decode", "inputs": {"vae": wire("vae", "vae"),
                                                    "latent": wire("sample", "latent")}},
        "out": {"type": "image/save", "inputs": {"image": wire("decode", "image")}},
    }}, "target": "out"}


def take_pixels(client, run):
    assert run["status"] == "succeeded", run
    data = client.get(f"/v1/takes/{run['takes'][0]['id']}/bytes").content
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB")), run["takes"][0]


def reference(img2img=False, **extra):
    from workers.models.zimage.tiny import smoke_pipeline

    pipe = smoke_pipeline(img2img=img2img)
    image = pipe(PROMPT, width=W, height=H, num_inference_steps=STEPS, guidance_scale=0.0,
                 generator=torch.Generator("cpu").manual_seed(SEED), **extra).images[0]
    return np.asarray(image.convert("RGB"))


def test_the_turbo_node_renders_exactly_what_the_diffusers_pipeline_renders(owner, stack):
    run = owner.wait_run(owner.post("/v1/runs", json=turbo_graph(stack)).json()["runId"])
    pixels, take = take_pixels(owner, run)
    assert np.array_equal(pixels, reference())
    assert take["seed"] == SEED and take.get("graphSha256"), take
    assert set(take["models"]) == {f"diffusion_models/{stack['model']}", f"vae/{stack['vae']}",
                                   f"text_encoders/{stack['text_encoder']}"}


def test_the_primitive_graph_renders_the_same_pixels(owner, stack):
    run = owner.wait_run(owner.post("/v1/runs", json=primitive_graph(stack)).json()["runId"])
    pixels, take = take_pixels(owner, run)
    assert np.array_equal(pixels, reference())
    data = owner.get(f"/v1/takes/{take['id']}/bytes").content
    assert '"seed": 11' in Image.open(io.BytesIO(data)).info["inline-farm"]


def test_img2img_renders_what_the_img2img_pipeline_renders(owner, stack):
    init = Image.fromarray(np.random.default_rng(3).integers(0, 255, (H, W, 3), dtype=np.uint8))
    buf = io.BytesIO()
    init.save(buf, format="PNG")
    asset = upload(owner, buf.getvalue()).json()
    graph = turbo_graph(stack, image_asset=asset["id"], strength=0.6)
    run = owner.wait_run(owner.post("/v1/runs", json=graph).json()["runId"])
    pixels, _ = take_pixels(owner, run)
    assert np.array_equal(pixels, reference(img2img=True, image=init, strength=0.6))


def test_different_seeds_give_different_images(owner, stack):
    one = owner.wait_run(owner.post("/v1/runs", json=primitive_graph(stack, seed=1)).json()["runId"])
    two = owner.wait_run(owner.post("/v1/runs", json=primitive_graph(stack, seed=2)).json()["runId"])
    assert not np.array_equal(take_pixels(owner, one)[0], take_pixels(owner, two)[0])


@pytest.mark.parametrize(("params", "code", "words"), [
    ({"width": 100}, "param_range", "multiple of 16"),
    ({"steps": 500}, "param_range", "steps"),
    ({"model": "missing.safetensors"}, "model_not_found", "diffusion_models/missing.safetensors"),
])
def test_bad_generation_params_are_a_422_naming_the_node(owner, stack, params, code, words):
    response = owner.post("/v1/runs", json=turbo_graph(stack, **params))
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert (error["code"], error["nodeId"]) == (code, "gen") and words in error["message"]


def test_a_corrupt_weight_file_fails_the_run_with_a_clear_message(owner, stack, data_dirs):
    folder = data_dirs["models"] / "diffusion_models"
    (folder / "broken.safetensors").write_bytes(b"this is not a safetensors file")
    (folder / "broken.config.json").write_text(
        (folder / f"{stack['model'].removesuffix('.safetensors')}.config.json").read_text())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        response = owner.post("/v1/runs", json=turbo_graph(stack, model="broken.safetensors"))
        if response.status_code != 422:
            break
        time.sleep(0.3)  # until a heartbeat reports the new file
    run = owner.wait_run(response.json()["runId"])
    assert run["status"] == "failed" and run["error"]["nodeId"] == "gen"
    assert "broken.safetensors" in run["error"]["message"]
    assert "Traceback" not in run["error"]["message"]


def test_cancelling_mid_sampling_stops_within_a_step_and_frees_the_worker(owner, stack, db_access):
    from apps.runs.models import RunEvent

    graph = turbo_graph(stack, steps=100, width=512, height=512, seed=99)
    run_id = owner.post("/v1/runs", json=graph).json()["runId"]
    wait_status(owner, run_id, "running")
    deadline = time.monotonic() + 60
    while not RunEvent.objects.filter(run_id=run_id, type="progress").exists():
        assert time.monotonic() < deadline, "sampling never reported progress"
        time.sleep(0.02)
    assert owner.delete(f"/v1/runs/{run_id}").json()["status"] == "cancelled"
    cancelled_seq = RunEvent.objects.get(run_id=run_id, type="run_done").seq

    nxt = owner.wait_run(owner.post("/v1/runs", json=turbo_graph(stack, seed=5)).json()["runId"])
    assert nxt["status"] == "succeeded"
    later = RunEvent.objects.filter(run_id=run_id, seq__gt=cancelled_seq)
    assert not later.exists()  # nothing after run_done: the attempt stopped at its next step
    steps = RunEvent.objects.filter(run_id=run_id, type="progress").count()
    assert steps < 100


def test_a_model_file_dropped_in_or_removed_changes_the_registry_version(owner, stack, data_dirs):
    def version_and_choices():
        body = owner.get("/v1/models").json()
        vae = next(n for n in body["nodes"] if n["type"] == "load/vae")
        return body["registryVersion"], vae["params"][0]["choices"]

    def wait_until(predicate):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            version, choices = version_and_choices()
            if predicate(choices):
                return version
            time.sleep(0.2)
        raise AssertionError(f"the fleet never reported the change: {choices}")

    before = wait_until(lambda choices: "spare.safetensors" not in choices)
    dropped = data_dirs["models"] / "vae" / "spare.safetensors"
    dropped.write_bytes((data_dirs["models"] / "vae" / stack["vae"]).read_bytes())
    with_file = wait_until(lambda choices: "spare.safetensors" in choices)
    dropped.unlink()
    after = wait_until(lambda choices: "spare.safetensors" not in choices)
    assert with_file != before and after == before


def test_sampling_progress_carries_a_small_preview_of_the_image(owner, stack, db_access):
    import base64

    from apps.runs.models import RunEvent

    run = owner.wait_run(owner.post("/v1/runs", json=turbo_graph(stack, seed=77)).json()["runId"])
    progress = [e.payload for e in RunEvent.objects.filter(run_id=run["id"], type="progress")]
    assert [p["step"] for p in progress] == list(range(1, STEPS + 1))
    previews = [p["preview"] for p in progress if "preview" in p]
    assert previews, "the first sampling step reports a preview"
    header, data = previews[0].split(",", 1)
    assert header == "data:image/png;base64"
    assert Image.open(io.BytesIO(base64.b64decode(data))).size == (W // 8, H // 8)
