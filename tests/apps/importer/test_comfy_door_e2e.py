"""ComfyUI's own API against a live farm: a client written only from ComfyUI's API (plain httpx +
websockets, nothing of the farm's) uploads, queues an img2img Z-Image Turbo workflow, follows
/ws, reads /history and downloads from /view; other users see nothing of it."""

from __future__ import annotations

import io
import json
import uuid
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from PIL import Image
from websockets.sync.client import connect

from tests.conftest import png, smoke_stack_reported
from tests.e2e.test_generation import PROMPT, SEED, H, W

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack(farm, data_dirs, personas):
    """The tiny random Z-Image stack in the worker's models dir, once a heartbeat reports it."""
    return smoke_stack_reported(farm, personas["owner"], data_dirs["models"])


class ComfyClient:
    """What a ComfyUI script does (script_examples/websockets_api_example.py), plus a header."""

    def __init__(self, base: str, token: str | None = None) -> None:
        self.base = base.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=self.base, headers=self.headers, timeout=30)

    def upload(self, data: bytes, name: str) -> httpx.Response:
        return self.http.post("/upload/image", files={"image": (name, data, "image/png")},
                              data={"overwrite": "true"})

    def queue(self, prompt: dict[str, Any], client_id: str) -> httpx.Response:
        return self.http.post("/prompt", content=json.dumps(
            {"prompt": prompt, "client_id": client_id}).encode())

    def history(self, prompt_id: str = "") -> Any:
        return self.http.get(f"/history/{prompt_id}" if prompt_id else "/history").json()

    def view(self, image: dict[str, str]) -> httpx.Response:
        return self.http.get("/view", params=image)

    def socket(self, client_id: str) -> Any:
        url = self.base.replace("http", "ws", 1) + f"/ws?clientId={client_id}"
        return connect(url, additional_headers=self.headers, open_timeout=10)

    def messages_until_done(self, ws: Any, prompt_id: str) -> list[dict[str, Any]]:
        """Text messages until ComfyUI's end of a prompt: `executing` with node None."""
        seen = []
        while True:
            out = ws.recv(timeout=60)
            if not isinstance(out, str):
                continue  # a binary preview
            message = json.loads(out)
            seen.append(message)
            data = message.get("data", {})
            if (message["type"] == "executing" and data.get("node") is None
                    and data.get("prompt_id") == prompt_id):
                return seen


def img2img(stack: dict[str, str], image: str, denoise: float = 0.6) -> dict[str, Any]:
    """An img2img Z-Image Turbo workflow in ComfyUI's API format."""
    return {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": stack["model"],
                                                     "weight_dtype": "default"}},
        "2": {"class_type": "CLIPLoader", "inputs": {
            "clip_name": f"{stack['text_encoder']}.safetensors", "type": "lumina2",
            "device": "default"}},
        "3": {"class_type": "VAELoader", "inputs": {"vae_name": stack["vae"]}},
        "4": {"class_type": "ModelSamplingAuraFlow", "inputs": {"shift": 3, "model": ["1", 0]}},
        "5": {"class_type": "CLIPTextEncode", "inputs": {"text": PROMPT, "clip": ["2", 0]}},
        "6": {"class_type": "ConditioningZeroOut", "inputs": {"conditioning": ["5", 0]}},
        "7": {"class_type": "LoadImage", "inputs": {"image": image, "upload": "image"}},
        "8": {"class_type": "VAEEncode", "inputs": {"pixels": ["7", 0], "vae": ["3", 0]}},
        "10": {"class_type": "KSampler", "inputs": {
            "seed": SEED, "steps": 4, "cfg": 1, "sampler_name": "euler", "scheduler": "simple",
            "denoise": denoise, "model": ["4", 0], "positive": ["5", 0], "negative": ["6", 0],
            "latent_image": ["8", 0]}},
        "11": {"class_type": "VAEDecode", "inputs": {"samples": ["10", 0], "vae": ["3", 0]}},
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "fox", "images": ["11", 0]}},
    }


@pytest.fixture
def comfy(farm, personas) -> ComfyClient:
    return ComfyClient(f"{farm.url}/comfy", personas["owner"])


@pytest.fixture
def stranger(farm, personas) -> ComfyClient:
    return ComfyClient(f"{farm.url}/comfy", personas["outsider"])


@pytest.fixture
def owner_key(db_access) -> tuple[int, str]:
    from django.contrib.auth.models import User

    from apps.importer.comfy_door import comfy_key_create

    key, secret = comfy_key_create(user=User.objects.get(username="owner"), name="script")
    return key.pk, secret


def test_a_comfyui_client_renders_img2img_and_reads_its_image_back(comfy, stranger, stack):
    uploaded = comfy.upload(png(W, H, (40, 90, 160)), "fox.png")
    assert uploaded.status_code == 200, uploaded.text
    assert uploaded.json() == {"name": "fox.png", "subfolder": "", "type": "input"}
    client_id = uuid.uuid4().hex
    with comfy.socket(client_id) as ws:
        first = json.loads(ws.recv(timeout=10))
        assert first["type"] == "status" and first["data"]["sid"] == client_id
        queued = comfy.queue(img2img(stack, uploaded.json()["name"]), client_id)
        assert queued.status_code == 200, queued.text
        body = queued.json()
        assert isinstance(body["number"], int) and body["node_errors"] == {}
        messages = comfy.messages_until_done(ws, body["prompt_id"])
    types = [m["type"] for m in messages if m["data"].get("prompt_id") == body["prompt_id"]]
    for expected in ("execution_start", "executing", "progress", "executed", "execution_success"):
        assert expected in types, types
    assert types.index("execution_success") < len(types) - 1  # executing(None) comes last
    executed = next(m for m in messages if m["type"] == "executed")
    assert executed["data"]["node"] == "9"

    entry = comfy.history(body["prompt_id"])[body["prompt_id"]]
    assert entry["status"]["status_str"] == "success" and entry["status"]["completed"]
    image = entry["outputs"]["9"]["images"][0]
    url = image.pop("url")  # the take's bytes at this door, for clients that open links
    assert image == executed["data"]["output"]["images"][0] and image["type"] == "output"
    assert url == "/comfy/view?" + urlencode(image)
    assert body["prompt_id"] in comfy.history()
    viewed = comfy.view(image)
    assert viewed.status_code == 200 and viewed.headers["content-type"] == "image/png"
    assert Image.open(io.BytesIO(viewed.content)).size == (W, H)

    # Another user sees none of it: not the prompt, not its image, not the upload.
    assert stranger.history(body["prompt_id"]) == {}
    assert body["prompt_id"] not in stranger.history()
    assert stranger.view(image).status_code == 404
    assert stranger.view({"filename": "fox.png", "subfolder": "", "type": "input"}
                         ).status_code == 404
    assert comfy.view({"filename": "fox.png", "subfolder": "", "type": "input"}).status_code == 200


def test_an_unknown_node_is_refused_naming_it(comfy, stack):
    workflow = img2img(stack, "fox.png")
    workflow["12"] = {"class_type": "FancyUpscaler", "inputs": {"image": ["11", 0]}}
    refused = comfy.queue(workflow, "c")
    assert refused.status_code == 400, refused.text
    body = refused.json()
    assert body["error"]["type"] == "invalid_prompt"
    assert body["error"]["message"] == "Cannot execute because node FancyUpscaler does not exist."
    assert body["node_errors"]["12"]["class_type"] == "FancyUpscaler"


def test_a_missing_required_input_is_refused_naming_the_node_and_input(comfy, stack):
    workflow = img2img(stack, "fox.png")
    del workflow["10"]["inputs"]["model"]
    refused = comfy.queue(workflow, "c")
    assert refused.status_code == 400, refused.text
    body = refused.json()
    assert body["error"]["type"] == "prompt_outputs_failed_validation"
    node = body["node_errors"]["10"]
    assert node["class_type"] == "KSampler"
    assert node["errors"][0]["type"] == "required_input_missing"
    assert node["errors"][0]["extra_info"]["input_name"] == "model"


def test_an_image_never_uploaded_is_refused_on_its_load_node(comfy, stack):
    refused = comfy.queue(img2img(stack, "never-uploaded.png"), "c")
    assert refused.status_code == 400, refused.text
    errors = refused.json()["node_errors"]["7"]["errors"]
    assert errors[0]["type"] == "custom_validation_failed"
    assert errors[0]["extra_info"]["input_name"] == "image"


def test_no_prompt_and_no_credentials_answer_comfyuis_shapes(comfy, farm):
    missing = comfy.http.post("/prompt", json={"client_id": "c"})
    assert missing.status_code == 400
    assert missing.json() == {"error": {"type": "no_prompt", "message": "No prompt provided",
                                        "details": "No prompt provided", "extra_info": {}},
                              "node_errors": {}}
    assert ComfyClient(f"{farm.url}/comfy").http.get("/queue").status_code == 401


def test_a_client_key_in_the_base_url_stands_for_its_user_until_revoked(farm, owner_key, stack):
    from apps.importer.comfy_door import comfy_key_revoke

    key_id, secret = owner_key
    keyed = ComfyClient(f"{farm.url}/comfy/k/{secret}")
    info = keyed.http.get("/object_info").json()
    assert stack["model"] in info["UNETLoader"]["input"]["required"]["unet_name"][0]
    assert info["KSampler"]["input"]["required"]["model"] == ["MODEL"]
    assert info["SaveImage"]["output_node"] is True
    stats = keyed.http.get("/system_stats").json()
    assert stats["devices"] and "comfyui_version" in stats["system"]
    assert keyed.http.get("/queue").json().keys() == {"queue_running", "queue_pending"}
    assert keyed.http.get("/api/queue").status_code == 200  # the newer frontend's prefix
    assert "diffusion_models" in keyed.http.get("/models").json()
    assert stack["vae"] in keyed.http.get("/models/vae").json()
    with keyed.socket("keyed") as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "status"
    comfy_key_revoke(key_id=key_id)
    assert keyed.http.get("/queue").status_code == 401


def test_interrupting_a_prompt_ends_it_as_comfyui_reports_an_interruption(comfy, stack):
    uploaded = comfy.upload(png(W, H, (10, 200, 60)), "slow.png").json()
    workflow = img2img(stack, uploaded["name"], denoise=1.0)
    workflow["10"]["inputs"]["steps"] = 100
    client_id = uuid.uuid4().hex
    with comfy.socket(client_id) as ws:
        ws.recv(timeout=10)
        queued = comfy.queue(workflow, client_id).json()
        assert comfy.http.get("/queue").json() != {"queue_running": [], "queue_pending": []}
        assert comfy.http.post("/interrupt", json={"prompt_id": queued["prompt_id"]}
                               ).status_code == 200
        types = [m["type"] for m in comfy.messages_until_done(ws, queued["prompt_id"])]
    assert "execution_interrupted" in types and "execution_success" not in types
    entry = comfy.history(queued["prompt_id"])[queued["prompt_id"]]
    assert entry["status"] == {**entry["status"], "status_str": "error", "completed": False}
    assert entry["status"]["messages"][-1][0] == "execution_interrupted"


def test_a_prompt_id_chosen_by_the_client_is_kept_and_cannot_be_reused(comfy, stack):
    name = comfy.upload(png(W, H, (90, 90, 20)), "own-id.png").json()["name"]
    chosen = str(uuid.uuid4())
    body = {"prompt": img2img(stack, name, denoise=0.3), "client_id": "c", "prompt_id": chosen}
    first = comfy.http.post("/prompt", json=body)
    assert first.status_code == 200 and first.json()["prompt_id"] == chosen, first.text
    again = comfy.http.post("/prompt", json=body)
    assert again.status_code == 400 and again.json()["error"]["type"] == "invalid_prompt"
