"""Hostile input to the ComfyUI door (and the ids /v1 shares with it), through the live HTTP and
websocket stack: every request below answered 500 (or closed 1011) before issue 40. Now each is
a 4xx in ComfyUI's shape where a ComfyUI client expects one; nothing of it is stored."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from apps.graphs.nodes import MAX_PROMPT
from tests.apps.importer.test_bounds import bomb
from tests.conftest import png

pytestmark = pytest.mark.e2e

NUL, SURROGATE = "a\x00b", "a\ud800b"
# Spellings Python's uuid.UUID reads and PostgreSQL (or the farm) does not: one id, one form.
ID = "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9"
ODD_IDS = [f"urn:uuid:{ID}", "{" + ID + "}", ID.replace("-", ""), ID.upper(),
           "0f1e2d3c4b5a-4978-8695-a4b3c2d1e0f9", f" {ID}"]


def comfy(farm: Any, token: str) -> httpx.Client:
    return httpx.Client(base_url=f"{farm.url}/comfy", timeout=30,
                        headers={"Authorization": f"Bearer {token}"})


def raw_query(**params: str) -> str:
    """A query string that carries what httpx would refuse to encode (lone surrogates)."""
    def encoded(text: str) -> str:
        return quote(text.encode("utf-8", "surrogatepass"))

    return "&".join(f"{encoded(k)}={encoded(v)}" for k, v in params.items())


def post_json(client: httpx.Client, path: str, body: Any) -> httpx.Response:
    # json.dumps escapes lone surrogates (\ud800) and writes NaN as the server must refuse it.
    return client.post(path, content=json.dumps(body).encode(),
                       headers={"Content-Type": "application/json"})


def assert_comfy_refusal(response: httpx.Response, status: int = 400) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "node_errors"}
    assert set(body["error"]) == {"type", "message", "details", "extra_info"}
    return body


def resize_prompt(image: str, width: int = 16) -> dict[str, Any]:
    """LoadImage → ImageScale → SaveImage (image-only: a run of milliseconds), API format."""
    return {
        "1": {"class_type": "LoadImage", "inputs": {"image": image, "upload": "image"}},
        "2": {"class_type": "ImageScale", "inputs": {"upscale_method": "bilinear", "width": width,
                                                     "height": 8, "crop": "disabled",
                                                     "image": ["1", 0]}},
        "3": {"class_type": "SaveImage", "inputs": {"filename_prefix": "x", "images": ["2", 0]}},
    }


@pytest.fixture(scope="module")
def owner_image(farm, personas) -> str:
    with comfy(farm, personas["owner"]) as client:
        uploaded = client.post("/upload/image", files={"image": ("hostile.png", png(20, 10))})
    assert uploaded.status_code == 200, uploaded.text
    return str(uploaded.json()["name"])


# --- text PostgreSQL cannot store, in every field ---------------------------------------------


@pytest.mark.parametrize("bad", [NUL, SURROGATE])
def test_nul_and_lone_surrogates_in_query_fields_answer_400_not_500(farm, personas, bad):
    with comfy(farm, personas["owner"]) as client:
        for path, params in [("/view", {"filename": bad}),
                             ("/view", {"filename": f"{bad}.png", "type": "input"}),
                             ("/view", {"filename": "x.png", "type": "input", "subfolder": bad}),
                             ("/history", {"max_items": "1", bad: "1"}),
                             ("/object_info", {"x": bad})]:
            response = client.get(f"{path}?{raw_query(**params)}")
            assert response.status_code < 500, (path, params, response.text)
            if bad == NUL:
                assert_comfy_refusal(response)
            # A lone surrogate does not survive a query string's UTF-8 decoding (it arrives as
            # U+FFFD, which is storable): answered as any other unknown name or parameter.


def multipart(fields: dict[str, bytes], file_name: bytes, data: bytes) -> tuple[bytes, str]:
    """A multipart body written byte by byte (httpx percent-encodes what a hostile client
    would send raw in a part's header)."""
    boundary = b"hostileboundary"
    parts = [b'--%s\r\nContent-Disposition: form-data; name="%s"\r\n\r\n%s\r\n'
             % (boundary, name.encode(), value) for name, value in fields.items()]
    parts.append(b'--%s\r\nContent-Disposition: form-data; name="image"; filename="%s"\r\n'
                 b"Content-Type: image/png\r\n\r\n%s\r\n" % (boundary, file_name, data))
    body = b"".join(parts) + b"--%s--\r\n" % boundary
    return body, f"multipart/form-data; boundary={boundary.decode()}"


@pytest.mark.parametrize("bad", [NUL, SURROGATE])
def test_nul_and_lone_surrogates_in_an_upload_answer_4xx_and_keep_nothing(
        farm, personas, bad, db_access):
    from apps.importer.models import ComfyUpload

    raw = bad.encode("utf-8", "surrogatepass")
    before = ComfyUpload.objects.count()
    with comfy(farm, personas["owner"]) as client:
        body, content_type = multipart({"subfolder": raw}, b"ok.png", png(8, 8))
        response = client.post("/upload/image", content=body,
                               headers={"Content-Type": content_type})
        assert response.status_code < 500, response.text
        if bad == NUL:
            assert_comfy_refusal(response)
            assert ComfyUpload.objects.count() == before
        # In a file name, Django's multipart parser drops NULs (the name kept is storable) and
        # a part whose name is not UTF-8 holds no file (400, as ComfyUI answers no image).
        body, content_type = multipart({}, raw + b".png", png(8, 8))
        response = client.post("/upload/image", content=body,
                               headers={"Content-Type": content_type})
        assert response.status_code == (200 if bad == NUL else 400), response.text
        assert bad == SURROGATE or "\x00" not in response.json()["name"]


@pytest.mark.parametrize("bad", [NUL, SURROGATE])
@pytest.mark.parametrize("where", ["client_id", "extra_data", "extra_key", "dropped_node",
                                   "kept_node_ignored_input", "node_id"])
def test_nul_and_lone_surrogates_anywhere_in_a_prompt_answer_400_in_comfyuis_shape(
        farm, personas, owner_image, bad, where, db_access):
    from apps.importer.models import ComfyPrompt

    prompt = resize_prompt(owner_image)
    body: dict[str, Any] = {"prompt": prompt, "client_id": "c"}
    if where == "client_id":
        body["client_id"] = bad
    elif where == "extra_data":
        body["extra_data"] = {"extra_pnginfo": {"workflow": {"note": bad}}}
    elif where == "extra_key":
        body[bad] = 1
    elif where == "dropped_node":
        prompt["9"] = {"class_type": "Note", "inputs": {"text": bad}}
    elif where == "kept_node_ignored_input":
        prompt["2"]["inputs"]["comment"] = bad
    else:
        prompt[bad] = {"class_type": "Note", "inputs": {}}
    before = ComfyPrompt.objects.count()
    with comfy(farm, personas["owner"]) as client:
        body_out = assert_comfy_refusal(post_json(client, "/prompt", body))
    assert body_out["error"]["type"] == "bad_request"
    if where in ("dropped_node", "kept_node_ignored_input"):
        node = "9" if where == "dropped_node" else "2"
        assert list(body_out["node_errors"]) == [node]
    assert ComfyPrompt.objects.count() == before


def test_a_client_id_the_database_cannot_store_closes_the_socket_4400_not_1011(farm, personas):
    url = farm.url.replace("http", "ws", 1) + "/comfy/ws?clientId=a%00b"
    with connect(url, additional_headers={"Authorization": f"Bearer {personas['owner']}"},
                 open_timeout=10) as ws, pytest.raises(ConnectionClosed):
        ws.recv(timeout=10)
    assert ws.close_code == 4400


# --- ids in forms Python reads and PostgreSQL does not ----------------------------------------


@pytest.mark.parametrize("odd", ODD_IDS)
def test_an_id_in_any_but_canonical_form_names_nothing_on_v1(owner, odd):
    for path in (f"/v1/runs/{quote(odd)}", f"/v1/takes/{quote(odd)}",
                 f"/v1/takes/{quote(odd)}/bytes"):
        response = owner.get(path)
        assert response.status_code == 404, (path, response.text)
        assert response.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize("odd", ODD_IDS[:3])
def test_an_asset_id_in_another_form_is_an_unknown_asset_not_a_500(owner, odd):
    asset = owner.post("/v1/assets", files={"file": ("a.png", png(8, 8), "image/png")}).json()
    spelled = odd.replace(ID, asset["id"]) if ID in odd else odd
    response = owner.post("/v1/runs", json={"graph": {"nodes": {
        "src": {"type": "image/load", "params": {"asset": spelled}},
        "out": {"type": "image/save", "inputs": {"image": {"node": "src", "port": "image"}}}}},
        "target": "out"})
    assert response.status_code == 422, response.text
    assert response.json()["error"] == {**response.json()["error"], "code": "asset_not_found",
                                        "nodeId": "src"}


@pytest.mark.parametrize("odd", ODD_IDS)
def test_the_door_reads_and_refuses_ids_by_the_same_rule(farm, personas, owner_image, odd):
    with comfy(farm, personas["owner"]) as client:
        assert client.get("/view", params={"filename": f"{odd}.png"}).status_code == 404
        assert client.get(f"/history/{quote(odd)}").json() == {}
        assert client.post("/interrupt", json={"prompt_id": odd}).status_code == 200
        assert client.post("/queue", json={"delete": [odd]}).status_code == 200
        refused = assert_comfy_refusal(post_json(client, "/prompt", {
            "prompt": resize_prompt(owner_image), "prompt_id": odd}))
    assert refused["error"]["type"] == "invalid_prompt" and "canonical" in refused["error"]["message"]


# --- nesting, numbers -------------------------------------------------------------------------


def nested(levels: int) -> str:
    return "[" * levels + "]" * levels


def test_deeply_nested_json_is_refused_4xx_everywhere(farm, personas, owner_image, owner):
    deep_input = json.dumps({"prompt": {**resize_prompt(owner_image), "4": {
        "class_type": "Note", "inputs": {"x": "__DEEP__"}}}}).replace('"__DEEP__"', nested(3000))
    with comfy(farm, personas["owner"]) as client:
        for path, body in [("/prompt", deep_input), ("/interrupt", nested(50_000)),
                           ("/queue", nested(50_000)), ("/prompt", nested(100_000))]:
            response = client.post(path, content=body.encode(),
                                   headers={"Content-Type": "application/json"})
            assert_comfy_refusal(response)
            assert "nests deeper" in response.json()["error"]["message"]
    imported = owner.post("/v1/import/comfy", content=nested(100_000).encode(),
                          headers={"Content-Type": "application/json"})
    assert imported.status_code == 422 and imported.json()["error"]["code"] == "not_json"
    runs = owner.post("/v1/runs", content=nested(100_000).encode(),
                      headers={"Content-Type": "application/json"})
    assert runs.status_code == 400 and runs.json()["error"]["code"] == "bad_request"


def test_huge_numbers_in_every_field_answer_4xx_or_an_empty_answer(
        farm, personas, owner_image):
    huge = "9" * 23
    with comfy(farm, personas["owner"]) as client:
        assert client.get("/history", params={"offset": huge}).json() == {}
        assert client.get("/history", params={"max_items": huge}).status_code == 200
        assert client.get("/history", params={"offset": "9" * 5000}).status_code == 400
        for value in (10**30, 1e308, float("inf"), float("nan"), -(10**30)):
            for node, name in (("2", "width"), ("2", "crop"), ("3", "filename_prefix")):
                prompt = resize_prompt(owner_image)
                prompt[node]["inputs"][name] = value
                response = post_json(client, "/prompt", {"prompt": prompt, "client_id": "c"})
                assert 400 <= response.status_code < 500, (value, name, response.text)
                assert_comfy_refusal(response)
            for path, body in (("/prompt", {"prompt": resize_prompt(owner_image),
                                            "number": value, "extra_data": {"n": value},
                                            "front": value}),
                               ("/interrupt", {"prompt_id": value}),
                               ("/queue", {"delete": [value], "clear": value})):
                response = post_json(client, path, body)
                assert response.status_code < 500, (path, value, response.text)


# --- the importer's bounds, through the web ---------------------------------------------------


def web_cpu_seconds(farm: Any) -> float:
    """The web process's CPU time so far (user + system), from /proc."""
    stat = Path(f"/proc/{farm.procs['web'].pid}/stat").read_text()
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_subgraph_bomb_is_refused_too_large_in_under_a_second_of_web_cpu(
        farm, personas, owner):
    for levels, fanout in ((4, 10), (13, 2)):
        before = web_cpu_seconds(farm)
        response = owner.post("/v1/import/comfy", json=bomb(levels, fanout))
        assert response.status_code == 422 and response.json()["error"]["code"] == "too_large"
        with comfy(farm, personas["owner"]) as client:
            door = post_json(client, "/prompt", {"prompt": bomb(levels, fanout)})
        assert_comfy_refusal(door)
        assert "INLINE_IMPORT_MAX_NODES" in door.json()["error"]["details"]
        assert web_cpu_seconds(farm) - before < 1.0


def test_nodes_off_the_output_path_are_not_kept_and_are_bounded_in_number(
        farm, personas, owner_image, db_access):
    from apps.importer.models import ComfyPrompt

    prompt = resize_prompt(owner_image, width=12)
    # The test farm's body limit is ~3 MB (its INLINE_ASSET_MAX_BYTES); 4 MB in production.
    prompt["9"] = {"class_type": "Note", "inputs": {"text": "x" * 2_500_000}}
    prompt["10"] = {"class_type": "ImageScale", "inputs": {"image": ["1", 0], "width": 8,
                                                           "height": 8, "junk": "y" * 10_000}}
    with comfy(farm, personas["owner"]) as client:
        queued = post_json(client, "/prompt", {"prompt": prompt, "client_id": "c"})
        assert queued.status_code == 200, queued.text
        kept = ComfyPrompt.objects.get(pk=queued.json()["prompt_id"]).prompt
        assert set(kept) == {"1", "2", "3"}
        many = {str(i): {"class_type": "Note", "inputs": {}} for i in range(10_000)}
        crowded = post_json(client, "/prompt", {"prompt": {**resize_prompt(owner_image), **many}})
        assert_comfy_refusal(crowded)
        assert "INLINE_IMPORT_MAX_NODES" in crowded.text
        too_long = resize_prompt(owner_image)
        too_long["2"]["inputs"]["junk"] = "z" * (MAX_PROMPT + 1)
        refused = assert_comfy_refusal(post_json(client, "/prompt", {"prompt": too_long}))
        assert list(refused["node_errors"]) == ["2"]
        assert str(MAX_PROMPT) in refused["node_errors"]["2"]["errors"][0]["message"]


# --- leaks between users ----------------------------------------------------------------------


def test_prompt_numbers_count_each_users_own_prompts(farm, personas, owner_image):
    with comfy(farm, personas["owner"]) as owner_door, comfy(farm, personas["outsider"]) as other:
        other_image = other.post("/upload/image", files={
            "image": ("mine.png", png(12, 12))}).json()["name"]
        first = post_json(owner_door, "/prompt", {"prompt": resize_prompt(owner_image, 20)})
        for width in (21, 22, 23):
            assert post_json(other, "/prompt", {
                "prompt": resize_prompt(other_image, width)}).status_code == 200
        second = post_json(owner_door, "/prompt", {"prompt": resize_prompt(owner_image, 24)})
    assert second.json()["number"] == first.json()["number"] + 1


def test_system_stats_shows_a_plain_user_no_host_details_and_staff_all(farm, personas):
    with comfy(farm, personas["outsider"]) as plain, comfy(farm, personas["staff"]) as staff:
        seen = plain.get("/system_stats").json()
        full = staff.get("/system_stats").json()
    assert seen["system"]["ram_total"] == 0 and seen["system"]["python_version"] == ""
    assert "platform" not in seen["system"] and seen["system"]["comfyui_version"]
    assert full["system"]["ram_total"] > 0 and full["system"]["python_version"]
    assert full["devices"] and len(seen["devices"]) == len(full["devices"])
    workers = {d["name"].split(": ")[0] for d in full["devices"]}
    assert not any(name in d["name"] for d in seen["devices"] for name in workers)


# --- the whole door, one ComfyUI client at a time ---------------------------------------------


def test_an_unreadable_body_is_a_400_in_comfyuis_shape_on_every_post(farm, personas):
    with comfy(farm, personas["owner"]) as client:
        for path in ("/prompt", "/queue", "/interrupt"):
            response = client.post(path, content=b"{not json",
                                   headers={"Content-Type": "application/json"})
            assert_comfy_refusal(response)
