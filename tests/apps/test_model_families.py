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
    ("text_encoders", "qwen_3_4b"): ("zimage", "text_encoder", ["zimage"]),
    ("loras", "notes.ckpt"): (None, None, []),
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


def chain(model: str, vae: str, encoder: str) -> GraphDoc:
    def ref(node: str, port: str) -> dict[str, str]:
        return {"node": node, "port": port}

    return GraphDoc.model_validate({"nodes": {
        "unet": {"type": "load/diffusion-model", "params": {"file": model}},
        "vae": {"type": "load/vae", "params": {"file": vae}},
        "clip": {"type": "load/text-encoder", "params": {"file": encoder}},
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
