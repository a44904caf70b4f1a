"""ComfyUI workflows through /v1/import/comfy and `farm_import --run` on a live farm, rendered by a
real worker on the tiny random Z-Image stack."""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
import pytest
from django.core.management import call_command
from PIL import Image

from tests.apps.importer.builder import switch_ui, workflow
from tests.conftest import smoke_stack_reported
from tests.e2e.test_generation import PROMPT, SEED, STEPS, H, W, reference

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack(farm, data_dirs, personas):
    return smoke_stack_reported(farm, personas["owner"], data_dirs["models"])


def smoke_ui(stack: dict[str, str]) -> dict[str, Any]:
    """The official-shaped UI workflow, set to the smoke stack through the subgraph's widgets.
    The text encoder is named as ComfyUI would (`.safetensors`); the fleet holds a folder."""
    doc = workflow("z_image_turbo.ui.json")
    instance = next(n for n in doc["nodes"] if n["id"] == 57)
    instance["widgets_values"] = [PROMPT, W, H, STEPS, SEED, "fixed", stack["model"],
                                  f"{stack['text_encoder']}.safetensors", stack["vae"]]
    return doc


def smoke_api(stack: dict[str, str]) -> dict[str, Any]:
    doc = workflow("z_image_turbo.api.json")
    doc["57:28"]["inputs"]["unet_name"] = stack["model"]
    doc["57:30"]["inputs"]["clip_name"] = f"{stack['text_encoder']}.safetensors"
    doc["57:29"]["inputs"]["vae_name"] = stack["vae"]
    doc["57:27"]["inputs"]["text"] = PROMPT
    doc["57:13"]["inputs"].update(width=W, height=H)
    doc["57:3"]["inputs"].update(seed=SEED, steps=STEPS)
    return doc


def post_workflow(client, doc: Any) -> Any:
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return client.post("/v1/import/comfy", content=body,
                       headers={"Content-Type": "application/json"})


def pixels_of(client, run: dict[str, Any]) -> np.ndarray:
    assert run["status"] == "succeeded", run
    data = client.get(f"/v1/takes/{run['takes'][0]['id']}/bytes").content
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def test_both_formats_import_to_one_graph_that_renders_comfyuis_pixels(owner, stack):
    ui, api = post_workflow(owner, smoke_ui(stack)), post_workflow(owner, smoke_api(stack))
    assert ui.status_code == api.status_code == 200, ui.text + api.text
    ui_body, api_body = ui.json(), api.json()
    assert ui_body["graph"] == api_body["graph"] and ui_body["target"] == api_body["target"] == "9"
    assert all(m["held"] for m in ui_body["report"]["models"])
    encoder = next(m for m in ui_body["report"]["models"] if m["folder"] == "text_encoders")
    assert encoder["name"] == stack["text_encoder"]
    submitted = owner.post("/v1/runs", json={"graph": ui_body["graph"], "target": "9"})
    assert submitted.status_code == 201, submitted.text
    run = owner.wait_run(submitted.json()["runId"])
    # The template's KSampler: res_multistep over simple sigmas, as ComfyUI renders it.
    assert np.array_equal(pixels_of(owner, run), comfy_pixels("res_multistep", "simple"))


def test_a_model_nobody_holds_is_reported_with_its_folder(owner, stack):
    response = post_workflow(owner, workflow("z_image_turbo.api.json"))
    assert response.status_code == 200, response.text
    unet = next(m for m in response.json()["report"]["models"] if m["id"] == "57:28")
    assert unet == {"id": "57:28", "type": "UNETLoader", "folder": "diffusion_models",
                    "name": "z_image_turbo_bf16.safetensors", "held": False}


@pytest.mark.parametrize(("body", "code"), [
    (b"<html>not json</html>", "not_json"),
    (b'{"hello": "world"}', "not_a_workflow"),
    (b'{"1": {"class_type": "VAELoader", "inputs": {"vae_name": "ae.safetensors"}}}', "no_output"),
])
def test_what_cannot_import_is_a_422_with_the_error_shape(owner, body, code):
    response = post_workflow(owner, body)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == code


def test_an_unmapped_node_on_the_output_path_is_a_422_naming_it_with_the_report(owner, stack):
    doc = smoke_api(stack)
    doc["57:8"]["class_type"] = "VAEDecodeHunyuan3D"
    response = post_workflow(owner, doc)
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["error"]["code"] == "unmapped_node" and body["error"]["nodeId"] == "57:8"
    assert body["report"]["unmapped"][0]["type"] == "VAEDecodeHunyuan3D"


def test_a_tiled_decode_imports_and_renders_the_untiled_image(owner, stack):
    """VAEDecodeTiled with tiles smaller than the image (4 of them): the untiled render's
    pixels, within one level of rounding."""
    doc = smoke_api(stack)
    plain = submit_and_wait(owner, post_workflow(owner, doc).json()["graph"])
    doc["57:8"] = {"class_type": "VAEDecodeTiled", "inputs": {
        **doc["57:8"]["inputs"], "tile_size": 32, "overlap": 16, "temporal_size": 64,
        "temporal_overlap": 8}}
    imported = post_workflow(owner, doc)
    assert imported.status_code == 200, imported.text
    body = imported.json()
    assert body["report"]["unmapped"] == [] and body["report"]["warnings"] == []
    assert body["graph"]["nodes"]["57:8"]["type"] == "vae/decode-tiled"
    assert body["graph"]["nodes"]["57:8"]["params"] == {"tile_size": 32, "overlap": 16}
    tiled = submit_and_wait(owner, body["graph"])
    diff = np.abs(pixels_of(owner, tiled).astype(int) - pixels_of(owner, plain).astype(int))
    assert diff.max() <= 1


def test_importing_needs_a_token(anonymous):
    assert post_workflow(anonymous, workflow("z_image_turbo.api.json")).status_code == 401


def test_farm_import_run_imports_and_submits_in_one_go(owner, stack, db_access, tmp_path):
    path = tmp_path / "workflow.json"
    path.write_text(json.dumps(smoke_ui(stack)))
    out = io.StringIO()
    call_command("farm_import", str(path), "--run", "--user", "owner", stdout=out,
                 stderr=io.StringIO())
    body = json.loads(out.getvalue())
    assert body["target"] == "9" and body["report"]["format"] == "ui"
    run = owner.wait_run(body["runId"])
    assert np.array_equal(pixels_of(owner, run), comfy_pixels("res_multistep", "simple"))


def custom_sampling_api(stack: dict[str, str], sigmas: str) -> dict[str, Any]:
    """The template with its KSampler replaced by ComfyUI's custom-sampling parts: RandomNoise,
    BasicGuider, KSamplerSelect (euler), ManualSigmas, SamplerCustomAdvanced."""
    doc = smoke_api(stack)
    del doc["57:3"], doc["57:33"]
    doc.update({
        "n": {"class_type": "RandomNoise", "inputs": {"noise_seed": SEED}},
        "g": {"class_type": "BasicGuider", "inputs": {"model": ["57:11", 0],
                                                      "conditioning": ["57:27", 0]}},
        "s": {"class_type": "KSamplerSelect", "inputs": {"sampler_name": "euler"}},
        "m": {"class_type": "ManualSigmas", "inputs": {"sigmas": sigmas}},
        "c": {"class_type": "SamplerCustomAdvanced",
              "inputs": {"noise": ["n", 0], "guider": ["g", 0], "sampler": ["s", 0],
                         "sigmas": ["m", 0], "latent_image": ["57:13", 0]}},
    })
    doc["57:8"]["inputs"]["samples"] = ["c", 0]
    return doc


def comfy_pixels(sampler: str, scheduler: str) -> np.ndarray:
    """ComfyUI's `sampler` over its `scheduler`'s sigmas (tests/workers/comfy_reference.py) on
    the smoke pipeline's own modules (Z-Image: shift 3), decoded by its VAE."""
    import torch

    from tests.workers import comfy_reference as ref
    from workers.device.policy import Placement
    from workers.models.values import TextEncoder, Vae
    from workers.models.zimage import engine, plugin
    from workers.models.zimage.tiny import smoke_pipeline
    from workers.sampling import SampleJob
    from workers.sampling.schedulers import FlowSampling, calculate_sigmas

    pipe, cpu = smoke_pipeline(), Placement("cpu", "float32")
    caption = engine.encode_prompt(TextEncoder("", "", pipe.text_encoder, pipe.tokenizer, cpu),
                                   PROMPT)

    def model(x: Any, sigma: Any) -> Any:
        sigma = sigma.reshape(()).float()
        job = SampleJob(x, torch.stack([sigma, torch.tensor(0.0)]), (sigma * 1000).reshape(1),
                        caption)
        return plugin.to_denoised(job, engine.predict_velocity(pipe.transformer, [job])[0])

    ms = FlowSampling(3.0)
    noise = engine.noise(engine.latent_shape(W, H), torch.Generator("cpu").manual_seed(SEED), "cpu")
    with torch.no_grad():
        x = ref.REFERENCE[sampler](model, noise, calculate_sigmas(ms, scheduler, STEPS), ms,
                                   ref.default_noise_sampler(noise, SEED))
        image = engine.decode_latents(Vae("", "", pipe.vae, cpu), x)
    return np.asarray(image.convert("RGB"))


def submit_and_wait(client: Any, graph: dict[str, Any]) -> dict[str, Any]:
    submitted = client.post("/v1/runs", json={"graph": graph, "target": "9"})
    assert submitted.status_code == 201, submitted.text
    return client.wait_run(submitted.json()["runId"])


def test_custom_sampling_and_a_dpmpp_2m_karras_ksampler_import_and_render(owner, stack):
    """ManualSigmas listing the family's own sigmas with euler is the pipeline's image (within
    rounding); a dpmpp_2m karras KSampler is ComfyUI's dpmpp_2m over karras sigmas."""
    from workers.models.zimage import engine

    own = engine.sigma_schedule(STEPS, W, H)[0]
    custom = post_workflow(owner, custom_sampling_api(stack, ", ".join(repr(float(s)) for s in own)))
    api = smoke_api(stack)
    api["57:3"]["inputs"].update(sampler_name="dpmpp_2m", scheduler="karras")
    ksampler = post_workflow(owner, api)
    assert custom.status_code == ksampler.status_code == 200, custom.text + ksampler.text
    custom_run, ksampler_run = (submit_and_wait(owner, body.json()["graph"])
                                for body in (custom, ksampler))  # one by one: none batched
    diff = np.abs(pixels_of(owner, custom_run).astype(int) - reference().astype(int))
    assert diff.max() <= 1
    assert np.array_equal(pixels_of(owner, ksampler_run), comfy_pixels("dpmpp_2m", "karras"))


def test_a_comfy_switch_renders_only_its_chosen_branch_at_a_math_derived_size(
    owner, stack, db_access
):
    """ComfyUI's way (tests/apps/importer/builder.py `switch_ui`): the latent's width is
    PrimitiveInt 32 → ComfyMathExpression `a * 2`; a PrimitiveBoolean picks, inside a subgraph,
    ImageScaleBy 0.5 over ImageInvert. The take is 32×24, the invert never ran (no node_done),
    the PreviewAny shows 64 on the run, and the take saved as WebP is served as WebP."""
    from apps.runs.models import RunEvent

    ui = switch_ui(flag=True, steps=STEPS)
    ui.node(1)["widgets_values"][0] = stack["model"]
    ui.node(2)["widgets_values"][0] = f"{stack['text_encoder']}.safetensors"
    ui.node(3)["widgets_values"][0] = stack["vae"]
    imported = post_workflow(owner, ui.doc())
    assert imported.status_code == 200, imported.text
    body = imported.json()
    assert body["report"]["unmapped"] == [] and body["report"]["warnings"] == []
    body["graph"]["nodes"]["10"]["params"]["format"] = "webp"
    submitted = owner.post("/v1/runs", json={"graph": body["graph"], "target": body["target"]})
    assert submitted.status_code == 201, submitted.text
    run = owner.wait_run(submitted.json()["runId"])
    assert run["status"] == "succeeded", run
    [take] = run["takes"]
    assert (take["width"], take["height"], take["mediaType"]) == (32, 24, "image/webp")
    served = owner.get(f"/v1/takes/{take['id']}/bytes")
    assert served.headers["content-type"] == "image/webp"
    assert Image.open(io.BytesIO(served.content)).size == (32, 24)
    assert run["values"] == [{"nodeId": "21", "nodeType": "util/preview", "kind": "int",
                              "value": 64, "text": "64"}]
    done = {e.payload["nodeId"] for e in RunEvent.objects.filter(run_id=run["id"],
                                                                 type="node_done")}
    assert {"12", "20:1", "10", "21"} <= done
    # The PrimitiveBoolean fixes the switch: settled at import, the unchosen branch is not in
    # the graph (never executed, never reported).
    assert not {"13", "20:2", "20:3"} & done


def test_a_bad_wire_around_a_switch_or_a_math_expression_is_a_422_naming_the_node(owner):
    def nodes(**extra: Any) -> dict[str, Any]:
        return {"graph": {"nodes": {
            "flag": {"type": "input/bool", "params": {"value": True}},
            "a": {"type": "input/text", "params": {"value": "x"}},
            "sw": {"type": "switch/text", "inputs": {"switch": {"node": "flag", "port": "value"},
                                                     "on_true": {"node": "a", "port": "text"}}},
            **extra}}, "target": "out"}

    wrong_kind = nodes(out={"type": "image/invert",
                            "inputs": {"image": {"node": "sw", "port": "output"}}})
    unsafe = nodes(out={"type": "math/expression",
                        "params": {"expression": "a.__class__"},
                        "inputs": {"a": {"node": "flag", "port": "value"}}})
    for body, code in ((wrong_kind, "kind_mismatch"), (unsafe, "bad_expression")):
        response = owner.post("/v1/runs", json=body)
        assert response.status_code == 422, response.text
        assert response.json()["error"]["code"] == code
        assert response.json()["error"]["nodeId"] == "out"


def test_an_upscale_model_pass_imports_and_renders_on_the_live_farm(owner, data_dirs):
    """LoadImage → UpscaleModelLoader (a tiny random ESRGAN x4 in the original `model.N` layout,
    as most community .pth files are) → ImageUpscaleWithModel → SaveImage: the worker reports
    the file, the import maps both nodes without a warning but the upload's, and the take is
    four times the plate."""
    import time

    from tests.workers.helpers import noise_image, png_bytes
    from workers.models.upscale.tiny import write_tiny_upscaler

    write_tiny_upscaler(data_dirs["models"], "4x-tiny.pth", layout="old")
    deadline = time.monotonic() + 30
    while "4x-tiny.pth" not in next(p for p in owner.get("/v1/models/load/upscale-model").json()[
            "params"] if p["name"] == "file")["choices"]:
        assert time.monotonic() < deadline, "no worker reported upscale_models/4x-tiny.pth"
        time.sleep(0.2)
    upload = owner.post("/v1/assets", files={"file": ("plate.png", png_bytes(
        noise_image(20, 12, seed=5)), "image/png")})
    assert upload.status_code == 201, upload.text
    imported = post_workflow(owner, {
        "1": {"class_type": "LoadImage", "inputs": {"image": "plate.png"}},
        "2": {"class_type": "UpscaleModelLoader", "inputs": {"model_name": "4x-tiny.pth"}},
        "3": {"class_type": "ImageUpscaleWithModel",
              "inputs": {"upscale_model": ["2", 0], "image": ["1", 0]}},
        "9": {"class_type": "SaveImage", "inputs": {"images": ["3", 0], "filename_prefix": "x"}},
    })
    assert imported.status_code == 200, imported.text
    body = imported.json()
    assert body["report"]["unmapped"] == []
    assert [w["id"] for w in body["report"]["warnings"]] == ["1"]  # upload plate.png
    assert body["report"]["models"][0]["held"] is True
    body["graph"]["nodes"]["1"]["params"]["asset"] = upload.json()["id"]
    run = submit_and_wait(owner, body["graph"])
    assert run["status"] == "succeeded", run
    [take] = run["takes"]
    assert (take["width"], take["height"]) == (80, 48)
    assert "upscale_models/4x-tiny.pth" in take["models"]  # the lineage names the file
