"""Model families at submit: the fleet's files say what they are, and a graph that mixes
families (or asks a family's node for another family's file) is a 422 naming the node and both
families — never a worker failure."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from apps.fleet.models import Worker
from apps.graphs.schema import GraphDoc
from apps.graphs.validation import GraphInvalid
from apps.runs.services import run_submit

pytestmark = pytest.mark.django_db

FILES = {  # (folder, name): (family, role, families) as a worker's heartbeat reports them
    ("diffusion_models", "flux1-dev.safetensors"): ("flux1", "transformer", ["flux1"]),
    ("diffusion_models", "z_image_turbo.safetensors"): ("zimage", "transformer", ["zimage"]),
    ("vae", "ae.safetensors"): ("flux1", "vae", ["flux1", "zimage"]),
    ("vae", "sdxl_vae.safetensors"): ("sdxl", "vae", ["sdxl"]),
    ("checkpoints", "sd_xl_base_1.0.safetensors"): ("sdxl", "checkpoint", ["sdxl"]),
    ("text_encoders", "t5xxl.safetensors"): ("flux1", "text_encoder", ["flux1"]),
    ("text_encoders", "clip_l.safetensors"): ("flux1", "text_encoder", ["flux1"]),
    ("text_encoders", "qwen_3_4b"): ("zimage", "text_encoder", ["zimage"]),
    ("loras", "notes.ckpt"): (None, None, []),
    ("diffusion_models", "wan2.1_t2v_1.3B.safetensors"): (None, None, []),  # no family's
    ("diffusion_models", "sd15.ckpt"): (None, None, []),  # pickled: unreadable without torch
}


@pytest.fixture
def fleet() -> Worker:
    files = [{"folder": folder, "name": name, "kind": "file", "size": 1000, "family": family,
              "role": role, "families": families}
             for (folder, name), (family, role, families) in FILES.items()]
    return Worker.objects.create(name="cpu@host", queues=["cpu"], state="online",
                                 last_heartbeat=timezone.now(), slots=2,
                                 device={"profile": "cpu"}, model_files=files)


@pytest.fixture
def artist() -> Any:
    return get_user_model().objects.create(username="artist")


def chain(model: str, vae: str, encoder: str, encoder_2: str | None = None) -> GraphDoc:
    def ref(node: str, port: str) -> dict[str, str]:
        return {"node": node, "port": port}

    encoders = {"file": encoder, **({"file_2": encoder_2} if encoder_2 else {})}
    return GraphDoc.model_validate({"nodes": {
        "unet": {"type": "load/diffusion-model", "params": {"file": model}},
        "vae": {"type": "load/vae", "params": {"file": vae}},
        "clip": {"type": "load/text-encoder", "params": encoders},
        "pos": {"type": "encode/text", "params": {"text": "a fox"},
                "inputs": {"encoder": ref("clip", "encoder")}},
        "empty": {"type": "latent/empty", "params": {"width": 64, "height": 64}},
        "sample": {"type": "sample", "params": {"steps": 2},
                   "inputs": {"model": ref("unet", "model"), "positive": ref("pos", "conditioning"),
                              "latent": ref("empty", "latent")}},
        "decode": {"type": "vae/decode", "inputs": {"vae": ref("vae", "vae"),
                                                    "latent": ref("sample", "latent")}},
        "save": {"type": "image/save", "inputs": {"image": ref("decode", "image")}},
    }})


def checkpoint_chain(vae: str | None = None) -> GraphDoc:
    """load/checkpoint's three outputs, or its model and encoder with another file's VAE."""
    def ref(node: str, port: str) -> dict[str, str]:
        return {"node": node, "port": port}

    nodes: dict[str, Any] = {
        "ckpt": {"type": "load/checkpoint", "params": {"file": "sd_xl_base_1.0.safetensors"}},
        "pos": {"type": "encode/text", "params": {"text": "a fox"},
                "inputs": {"encoder": ref("ckpt", "encoder")}},
        "empty": {"type": "latent/empty", "params": {"width": 64, "height": 64}},
        "sample": {"type": "sample", "params": {"steps": 2},
                   "inputs": {"model": ref("ckpt", "model"), "positive": ref("pos", "conditioning"),
                              "latent": ref("empty", "latent")}},
        "decode": {"type": "vae/decode", "inputs": {"vae": ref("vae" if vae else "ckpt", "vae"),
                                                    "latent": ref("sample", "latent")}},
        "save": {"type": "image/save", "inputs": {"image": ref("decode", "image")}},
    }
    if vae:
        nodes["vae"] = {"type": "load/vae", "params": {"file": vae}}
    return GraphDoc.model_validate({"nodes": nodes})


def refusal(owner: Any, graph: GraphDoc) -> GraphInvalid:
    with pytest.raises(GraphInvalid) as refused:
        run_submit(owner=owner, graph=graph, target="save")
    return refused.value


def test_a_flux_transformer_decoded_by_an_sdxl_vae_is_refused_naming_the_node_and_both_families(
        fleet, artist):
    error = refusal(artist, chain("flux1-dev.safetensors", "sdxl_vae.safetensors",
                                  "t5xxl.safetensors"))
    assert (error.code, error.node_id) == ("family_mismatch", "decode")
    assert "sdxl" in error.message and "flux1" in error.message


def test_a_flux_transformer_with_z_image_s_text_encoder_is_refused_at_the_sampler(fleet, artist):
    error = refusal(artist, chain("flux1-dev.safetensors", "ae.safetensors", "qwen_3_4b"))
    assert (error.code, error.node_id) == ("family_mismatch", "sample")
    assert "zimage" in error.message and "flux1" in error.message


def test_one_family_s_files_submit_and_a_vae_two_families_share_serves_either(fleet, artist):
    run, created = run_submit(owner=artist, target="save", graph=chain(
        "z_image_turbo.safetensors", "ae.safetensors", "qwen_3_4b"))
    assert created and run.requirement["families"] == ["zimage"]
    assert run.queue == "cpu"


def test_a_z_image_node_asked_for_a_flux_file_is_refused_naming_both_families(fleet, artist):
    graph = GraphDoc.model_validate({"nodes": {"gen": {"type": "zimage/turbo", "params": {
        "prompt": "a fox", "width": 64, "height": 64, "model": "flux1-dev.safetensors",
        "vae": "ae.safetensors", "text_encoder": "qwen_3_4b"}}}})
    with pytest.raises(GraphInvalid) as refused:
        run_submit(owner=artist, graph=graph, target="gen")
    assert (refused.value.code, refused.value.node_id) == ("model_family", "gen")
    assert "zimage" in refused.value.message and "flux1" in refused.value.message


def test_an_sdxl_checkpoint_s_three_outputs_submit_and_a_flux_vae_after_it_is_refused(
        fleet, artist):
    run, created = run_submit(owner=artist, target="save", graph=checkpoint_chain())
    assert created and run.requirement["families"] == ["sdxl"]
    error = refusal(artist, checkpoint_chain(vae="ae.safetensors"))
    assert (error.code, error.node_id) == ("family_mismatch", "decode")
    assert "sdxl" in error.message and "flux1" in error.message

def test_a_flux_graph_loading_one_text_encoder_file_is_refused_naming_the_loader(fleet, artist):
    """FLUX.1 needs CLIP-L and T5: with T5 alone it failed on the worker, at load time."""
    error = refusal(artist, chain("flux1-dev.safetensors", "ae.safetensors", "t5xxl.safetensors"))
    assert (error.code, error.node_id) == ("text_encoders", "clip")
    assert "CLIP-L and T5" in error.message and "t5xxl.safetensors" in error.message
    run, created = run_submit(owner=artist, target="save", graph=chain(
        "flux1-dev.safetensors", "ae.safetensors", "t5xxl.safetensors", "clip_l.safetensors"))
    assert created and run.requirement["families"] == ["flux1"]


def test_a_z_image_graph_loading_two_text_encoder_files_is_refused_naming_the_loader(fleet,
                                                                                     artist):
    twice = refusal(artist, chain("z_image_turbo.safetensors", "ae.safetensors", "qwen_3_4b",
                                  "qwen_3_4b"))
    assert (twice.code, twice.node_id) == ("text_encoders", "clip")
    assert "one file twice" in twice.message and "Qwen3" in twice.message
    error = refusal(artist, chain("z_image_turbo.safetensors", "ae.safetensors", "qwen_3_4b",
                                  "t5xxl.safetensors"))
    assert (error.code, error.node_id) == ("family_mismatch", "clip")  # a file of another family
    assert "zimage" in error.message and "flux1" in error.message


def test_a_flux_transformer_asked_to_sample_a_z_image_latent_is_refused_naming_both(fleet, artist):
    graph = chain("flux1-dev.safetensors", "ae.safetensors", "t5xxl.safetensors",
                  "clip_l.safetensors").model_dump()
    graph["nodes"]["zvae"] = {"type": "load/vae", "params": {"file": "ae.safetensors"}}
    graph["nodes"]["zunet"] = {"type": "load/diffusion-model",
                               "params": {"file": "z_image_turbo.safetensors"}}
    graph["nodes"]["zclip"] = {"type": "load/text-encoder", "params": {"file": "qwen_3_4b"}}
    graph["nodes"]["zpos"] = {"type": "encode/text", "params": {"text": "x"},
                              "inputs": {"encoder": {"node": "zclip", "port": "encoder"}}}
    graph["nodes"]["zsample"] = {"type": "sample", "params": {"steps": 2}, "inputs": {
        "model": {"node": "zunet", "port": "model"},
        "positive": {"node": "zpos", "port": "conditioning"},
        "latent": {"node": "empty", "port": "latent"}}}
    graph["nodes"]["sample"]["inputs"]["latent"] = {"node": "zsample", "port": "latent"}
    error = refusal(artist, GraphDoc.model_validate(graph))
    assert (error.code, error.node_id) == ("family_mismatch", "sample")
    assert "zimage" in error.message and "flux1" in error.message


def client_for(user: Any) -> Client:
    from apps.accounts.services import token_create

    secret = token_create(user=user, name="test")[1]
    return Client(HTTP_AUTHORIZATION=f"Bearer {secret}")


def test_the_files_endpoint_says_each_file_s_family_role_and_size(fleet, artist):
    files = client_for(artist).get("/v1/models/files").json()["files"]
    ae = next(f for f in files if f["name"] == "ae.safetensors")
    assert {k: ae[k] for k in ("folder", "family", "role", "bytes")} == {
        "folder": "vae", "family": "flux1", "role": "vae", "bytes": 1000}
    assert len(files) == len(FILES)
    only = client_for(artist).get("/v1/models/files?family=sdxl").json()["files"]
    assert [f["name"] for f in only] == ["sd_xl_base_1.0.safetensors", "sdxl_vae.safetensors"]


def test_model_pickers_filter_by_family(fleet, artist):
    api = client_for(artist)

    def choices(node_type: str, param: str, query: str = "") -> list[str]:
        body = api.get(f"/v1/models/{node_type}{query}").json()
        return next(p["choices"] for p in body["params"] if p["name"] == param)

    assert choices("load/vae", "file") == ["ae.safetensors", "sdxl_vae.safetensors"]
    assert choices("load/vae", "file", "?family=sdxl") == ["sdxl_vae.safetensors"]
    assert choices("zimage/turbo", "model") == ["z_image_turbo.safetensors"]  # its own family


def test_the_workers_endpoint_lists_the_families_a_worker_holds(fleet, artist):
    items = client_for(artist).get("/v1/workers").json()["items"]
    assert items[0]["families"] == ["flux1", "sdxl", "zimage"]


def test_the_admin_shows_the_families_a_worker_holds(fleet):
    lead = get_user_model().objects.create_superuser("lead", "lead@example.com", "pw")
    admin = Client()
    admin.force_login(lead)
    listing = admin.get("/admin/fleet/worker/").content.decode()
    assert '<td class="field-family_list">flux1, sdxl, zimage</td>' in listing
    page = admin.get(f"/admin/fleet/worker/{fleet.pk}/change/").content.decode()
    assert "flux1, sdxl, zimage" in page


HUNYUAN = {  # a HunyuanVideo text-to-video workflow's loaders and sampler, ComfyUI API format
    "1": {"class_type": "UNETLoader", "inputs": {"unet_name": "hunyuan_video_t2v_720p_bf16.safetensors",
                                                 "weight_dtype": "default"}},
    "2": {"class_type": "CLIPLoader", "inputs": {"clip_name": "llava_llama3_fp8.safetensors",
                                                 "type": "hunyuan_video", "device": "default"}},
    "3": {"class_type": "CLIPTextEncode", "inputs": {"text": "a fox", "clip": ["2", 0]}},
    "4": {"class_type": "EmptyHunyuanLatentVideo", "inputs": {"width": 832, "height": 480,
                                                              "length": 33, "batch_size": 1}},
    "5": {"class_type": "KSampler", "inputs": {
        "model": ["1", 0], "positive": ["3", 0], "negative": ["3", 0], "latent_image": ["4", 0],
        "seed": 1, "steps": 30, "cfg": 6, "sampler_name": "uni_pc", "scheduler": "simple",
        "denoise": 1}},
    "6": {"class_type": "VAELoader", "inputs": {"vae_name": "hunyuan_video_vae_bf16.safetensors"}},
    "7": {"class_type": "VAEDecode", "inputs": {"samples": ["5", 0], "vae": ["6", 0]}},
    "8": {"class_type": "SaveAnimatedWEBP", "inputs": {"images": ["7", 0], "fps": 16}},
}


def test_both_doors_refuse_a_workflow_of_a_family_the_farm_does_not_run(fleet, artist):
    """/v1/import/comfy: 422 `unsupported_family` naming the node; ComfyUI's /prompt: its 400
    with the node in `node_errors`, not `invalid_prompt` for the family's own node types."""
    api = client_for(artist)
    response = api.post("/v1/import/comfy", HUNYUAN, content_type="application/json")
    assert response.status_code == 422, response.content
    error = response.json()["error"]
    assert (error["code"], error["nodeId"]) == ("unsupported_family", "2")
    assert "hunyuan-video model family" in error["message"]
    door = api.post("/comfy/prompt", {"prompt": HUNYUAN, "client_id": "c"},
                    content_type="application/json")
    assert door.status_code == 400, door.content
    entry = door.json()["node_errors"]["2"]
    assert entry["class_type"] == "CLIPLoader"
    assert entry["errors"][0]["type"] == "unsupported_family"
    assert "hunyuan-video model family" in entry["errors"][0]["message"]
    assert entry["errors"][0]["extra_info"] == {}  # no input of the node is to blame


def test_a_held_safetensors_file_no_family_recognises_is_refused_at_submit(fleet, artist):
    """Its load could only fail on the worker; a pickled file says nothing until loaded."""
    error = refusal(artist, chain("wan2.1_t2v_1.3B.safetensors", "ae.safetensors", "qwen_3_4b"))
    assert (error.code, error.node_id) == ("unsupported_family", "unet")
    assert "diffusion_models/wan2.1_t2v_1.3B.safetensors" in error.message
    assert "flux1, zimage" in error.message
    _, created = run_submit(owner=artist, target="save",
                            graph=chain("sd15.ckpt", "ae.safetensors", "qwen_3_4b"))
    assert created
