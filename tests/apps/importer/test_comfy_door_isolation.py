"""The door's isolation beyond /history and /view: another user's clientId on /ws, their prompts
on /interrupt and /queue, their uploads on /upload/image, /prompt and /object_info. The owner
and a teammate share a team; the outsider is a stranger to both (tests/conftest.py personas)."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from tests.apps.importer.test_comfy_door_hostile import comfy, post_json, resize_prompt
from tests.conftest import png, smoke_stack_reported

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack(farm, data_dirs, personas):
    return smoke_stack_reported(farm, personas["owner"], data_dirs["models"])


def socket(farm: Any, token: str, client_id: str) -> Any:
    url = farm.url.replace("http", "ws", 1) + f"/comfy/ws?clientId={client_id}"
    return connect(url, additional_headers={"Authorization": f"Bearer {token}"}, open_timeout=10)


def messages_for(ws: Any, seconds: float) -> list[dict[str, Any]]:
    """The text messages `ws` receives in `seconds`."""
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            message = ws.recv(timeout=left)
        except TimeoutError:
            break
        if isinstance(message, str):
            seen.append(json.loads(message))
    return seen


def upload(client: httpx.Client, name: str, data: bytes, overwrite: bool = False) -> str:
    response = client.post("/upload/image", files={"image": (name, data, "image/png")},
                           data={"overwrite": "true"} if overwrite else {})
    assert response.status_code == 200, response.text
    return str(response.json()["name"])


def test_a_socket_with_another_users_client_id_hears_nothing_of_their_prompts(farm, personas):
    client_id = uuid.uuid4().hex
    with comfy(farm, personas["owner"]) as owner, \
            socket(farm, personas["outsider"], client_id) as theirs, \
            socket(farm, personas["owner"], client_id) as mine:
        assert json.loads(theirs.recv(timeout=10))["type"] == "status"
        assert json.loads(mine.recv(timeout=10))["type"] == "status"
        name = upload(owner, "ws-isolation.png", png(14, 9, (1, 2, 3)))
        queued = post_json(owner, "/prompt", {"prompt": resize_prompt(name, 13),
                                              "client_id": client_id}).json()
        heard = messages_for(mine, 15)
        overheard = messages_for(theirs, 1)
    assert any(m["data"].get("prompt_id") == queued["prompt_id"] for m in heard)
    assert [m["type"] for m in overheard] in ([], ["status"])
    assert all("prompt_id" not in m["data"] for m in overheard)


def queued_prompt(farm: Any, token: str, stack: dict[str, str]) -> tuple[str, str]:
    """(prompt id, run id) of an owner's prompt whose run waits (no worker serves xfuser.8)."""
    from django.contrib.auth.models import User
    from django.db.models import Max

    from apps.importer.models import ComfyPrompt
    from apps.runs.models import Run

    with httpx.Client(base_url=farm.url, headers={"Authorization": f"Bearer {token}"}) as v1:
        run_id = v1.post("/v1/runs", json={"graph": {"nodes": {
            "gen": {"type": "zimage/turbo", "params": {"prompt": "waits", "width": 64,
                                                       "height": 48, "steps": 2,
                                                       "parallel": "8", **stack}},
            "out": {"type": "image/save", "inputs": {"image": {"node": "gen",
                                                               "port": "image"}}}}},
            "target": "out"}).json()["runId"]
    owner = User.objects.get(username="owner")
    top = ComfyPrompt.objects.filter(owner=owner).aggregate(top=Max("number"))["top"] or 0
    prompt = ComfyPrompt.objects.create(number=top + 1, owner=owner,
                                        run=Run.objects.get(pk=run_id), prompt={},
                                        outputs=["out"])
    return str(prompt.pk), run_id


def test_a_stranger_can_neither_interrupt_nor_delete_my_prompt(
        farm, personas, stack, db_access):
    from apps.runs.models import Run

    prompt_id, run_id = queued_prompt(farm, personas["owner"], stack)
    with comfy(farm, personas["outsider"]) as stranger, comfy(farm, personas["owner"]) as owner:
        assert stranger.post("/interrupt", json={"prompt_id": prompt_id}).status_code == 200
        assert stranger.post("/queue", json={"delete": [prompt_id]}).status_code == 200
        assert stranger.post("/queue", json={"clear": True}).status_code == 200
        assert stranger.post("/interrupt").status_code == 200
        assert Run.objects.get(pk=run_id).status == "queued"
        assert prompt_id not in json.dumps(stranger.get("/queue").json())
        assert prompt_id in json.dumps(owner.get("/queue").json())
        assert owner.post("/queue", json={"delete": [prompt_id]}).status_code == 200
    assert Run.objects.get(pk=run_id).status == "cancelled"


def test_an_upload_over_a_same_named_file_of_another_user_leaves_theirs_alone(farm, personas):
    mine, theirs = png(10, 10, (250, 0, 0)), png(10, 10, (0, 0, 250))
    name = f"same-{uuid.uuid4().hex[:6]}.png"
    with comfy(farm, personas["owner"]) as owner, comfy(farm, personas["outsider"]) as stranger:
        assert upload(owner, name, mine) == name
        assert upload(stranger, name, theirs, overwrite=True) == name
        assert upload(stranger, name, png(10, 10, (0, 250, 0))) == name.replace(".png", " (1).png")
        view = {"filename": name, "type": "input"}
        assert owner.get("/view", params=view).content == mine
        assert stranger.get("/view", params=view).content == theirs


def test_a_load_image_naming_another_users_upload_is_refused(farm, personas, db_access):
    from apps.importer.models import ComfyUpload

    name = f"private-{uuid.uuid4().hex[:6]}.png"
    with comfy(farm, personas["owner"]) as owner, comfy(farm, personas["outsider"]) as stranger:
        upload(owner, name, png(9, 9, (9, 9, 9)))
        asset_id = ComfyUpload.objects.get(name=name).asset_id
        for reference in (name, f"{asset_id}.png"):
            refused = post_json(stranger, "/prompt", {"prompt": resize_prompt(reference)})
            assert refused.status_code == 400, refused.text
            assert refused.json()["node_errors"]["1"]["errors"][0]["type"] == (
                "custom_validation_failed")
        assert post_json(owner, "/prompt", {"prompt": resize_prompt(name)}).status_code == 200


def test_object_info_lists_only_my_own_uploads_for_load_image(farm, personas):
    name = f"listed-{uuid.uuid4().hex[:6]}.png"
    with comfy(farm, personas["owner"]) as owner, comfy(farm, personas["outsider"]) as stranger:
        upload(owner, name, png(7, 7, (7, 7, 70)))

        def choices(client: httpx.Client) -> list[str]:
            info = client.get("/object_info/LoadImage").json()
            return list(info["LoadImage"]["input"]["required"]["image"][0])

        assert name in choices(owner)
        assert name not in choices(stranger)
