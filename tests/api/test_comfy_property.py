"""Property-based test of the ComfyUI door (it has no OpenAPI schema of its own, so a
hand-written hypothesis strategy per route): hostile values — NUL, lone surrogates and control
characters, ids in every non-canonical UUID spelling, huge and non-finite numbers, nesting —
in every field, the ones the farm ignores included; 0 server errors, and a refused /prompt
always answers in ComfyUI's shape. Through the live HTTP and websocket stack."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.conftest import png

pytestmark = pytest.mark.e2e

EXAMPLES_PER_ROUTE = 40
ID = str(uuid.uuid4())
ODD_IDS = [f"urn:uuid:{ID}", "{" + ID + "}", ID.replace("-", ""), ID.upper(), f"{ID}\x00"]

texts = st.one_of(
    st.text(max_size=30),
    st.text(alphabet=st.characters(categories=["Cs", "Cc"]), max_size=6),  # surrogates, NUL
    st.sampled_from(["a\x00b", "a\ud800b", "\udfff", *ODD_IDS, ID, "9" * 40, "../../etc",
                     "-1", "1e400", "NaN"]),
)
numbers = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([2**63, 2**64, -(2**63) - 1, 10**25, 1e308]),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, texts)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(texts, inner, max_size=3)), max_leaves=8)


def deep(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


json_values = st.one_of(values, st.sampled_from([deep(70), deep(900)]))


def quoted(text: str) -> str:
    return quote(text.encode("utf-8", "surrogatepass"), safe="")


def query(params: dict[str, str]) -> str:
    return "&".join(f"{quoted(k)}={quoted(v)}" for k, v in params.items())


def resize_prompt(image: str) -> dict[str, Any]:
    return {
        "1": {"class_type": "LoadImage", "inputs": {"image": image, "upload": "image"}},
        "2": {"class_type": "ImageScale", "inputs": {"upscale_method": "bilinear", "width": 16,
                                                     "height": 8, "crop": "disabled",
                                                     "image": ["1", 0]}},
        "3": {"class_type": "SaveImage", "inputs": {"filename_prefix": "p", "images": ["2", 0]}},
    }


@st.composite
def prompt_bodies(draw: Any, image: str) -> dict[str, Any]:
    """A /prompt body that runs, with hostile values put into some of its fields."""
    prompt = resize_prompt(image)
    body: dict[str, Any] = {"prompt": prompt, "client_id": "prop"}
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        where = draw(st.sampled_from(["input", "new_input", "node", "node_id", "client_id",
                                      "extra_data", "prompt_id", "top", "class_type"]))
        value = draw(json_values)
        node = draw(st.sampled_from(["1", "2", "3"]))
        if where == "input":
            name = draw(st.sampled_from(list(prompt[node]["inputs"])))
            prompt[node]["inputs"][name] = value
        elif where == "new_input":
            prompt[node]["inputs"][draw(texts)] = value
        elif where == "node":
            prompt[draw(texts)] = {"class_type": "Note", "inputs": {"text": value}}
        elif where == "node_id":
            prompt[draw(texts)] = value
        elif where == "class_type":
            prompt[node]["class_type"] = value
        elif where == "top":
            body[draw(texts)] = value
        else:
            body[where] = value
    return body


def send_json(client: httpx.Client, path: str, body: Any) -> httpx.Response:
    return client.post(path, content=json.dumps(body).encode(),
                       headers={"Content-Type": "application/json"})


def assert_no_server_error(response: httpx.Response, what: Any) -> None:
    assert response.status_code < 500, (what, response.status_code, response.text[:500])


PROPERTY = settings(max_examples=EXAMPLES_PER_ROUTE, deadline=None, database=None,
                    derandomize=True, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def door(farm, personas):
    with httpx.Client(base_url=f"{farm.url}/comfy", timeout=30,
                      headers={"Authorization": f"Bearer {personas['owner']}"}) as client:
        yield client


@pytest.fixture(scope="module")
def image(door) -> str:
    return str(door.post("/upload/image", files={"image": ("prop.png", png(12, 8))}).json()["name"])


GETS = {
    "/history": ["max_items", "offset"],
    "/view": ["filename", "type", "subfolder"],
    "/prompt": ["x"], "/queue": ["x"], "/object_info": ["x"], "/system_stats": ["x"],
    "/embeddings": ["x"], "/models": ["x"],
}


def test_every_get_route_answers_hostile_query_fields_without_a_server_error(door, capsys):
    statuses: dict[int, int] = {}

    @PROPERTY
    @given(path=st.sampled_from(sorted(GETS)), data=st.data())
    def check(path: str, data: Any) -> None:
        names = GETS[path]
        params = {name: data.draw(st.one_of(texts, numbers.map(str)), label=name)
                  for name in data.draw(st.lists(st.sampled_from(names), max_size=3,
                                                 unique=True))}
        if data.draw(st.booleans()):
            params[data.draw(texts)] = data.draw(texts)
        response = door.get(f"{path}?{query(params)}")
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        assert_no_server_error(response, (path, params))

    check()
    with capsys.disabled():
        print(f"\ndoor GETs: statuses {dict(sorted(statuses.items()))}")


def test_every_path_parameter_answers_hostile_values_without_a_server_error(door):
    @PROPERTY
    @given(route=st.sampled_from(["/history/", "/object_info/", "/models/"]),
           value=st.one_of(texts.filter(bool), st.sampled_from(ODD_IDS)))
    def check(route: str, value: str) -> None:
        assert_no_server_error(door.get(route + quoted(value)), (route, value))

    check()


def test_prompt_answers_hostile_fields_without_a_server_error_in_comfyuis_shape(
        door, image, capsys):
    statuses: dict[int, int] = {}

    @PROPERTY
    @given(data=st.data())
    def check(data: Any) -> None:
        body = data.draw(prompt_bodies(image))
        response = send_json(door, "/prompt", body)
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        assert_no_server_error(response, body)
        if response.status_code >= 400 and response.status_code != 413:
            answer = response.json()
            assert set(answer) == {"error", "node_errors"}, answer
            assert {"type", "message", "details", "extra_info"} <= set(answer["error"])

    check()
    with capsys.disabled():
        print(f"\ndoor /prompt: statuses {dict(sorted(statuses.items()))}")


def test_queue_interrupt_and_history_posts_answer_hostile_bodies_without_a_server_error(door):
    @PROPERTY
    @given(path=st.sampled_from(["/queue", "/interrupt", "/history"]), body=st.one_of(
        json_values, st.fixed_dictionaries({}, optional={
            "delete": st.one_of(st.lists(st.one_of(texts, numbers, json_values), max_size=3),
                                json_values),
            "clear": json_values, "prompt_id": st.one_of(texts, numbers, json_values)})))
    def check(path: str, body: Any) -> None:
        assert_no_server_error(send_json(door, path, body), (path, body))

    check()


def test_upload_answers_hostile_form_fields_without_a_server_error(door):
    @PROPERTY
    @given(fields=st.dictionaries(st.sampled_from(["subfolder", "overwrite", "type"]), texts),
           name=texts)
    def check(fields: dict[str, str], name: str) -> None:
        boundary = "propboundary"
        parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n'.encode()
                 + v.encode("utf-8", "surrogatepass") + b"\r\n" for k, v in fields.items()]
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="image"; '
                     'filename="'.encode() + name.encode("utf-8", "surrogatepass")
                     + b'"\r\nContent-Type: image/png\r\n\r\n' + png(6, 6) + b"\r\n")
        body = b"".join(parts) + f"--{boundary}--\r\n".encode()
        response = door.post("/upload/image", content=body, headers={
            "Content-Type": f"multipart/form-data; boundary={boundary}"})
        assert_no_server_error(response, (fields, name))

    check()


def test_the_socket_answers_any_client_id_without_an_internal_error(farm, personas):
    base = farm.url.replace("http", "ws", 1) + "/comfy/ws"
    headers = {"Authorization": f"Bearer {personas['owner']}"}

    @settings(max_examples=20, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(client_id=texts)
    def check(client_id: str) -> None:
        with connect(f"{base}?clientId={quoted(client_id)}", additional_headers=headers,
                     open_timeout=10) as ws:
            try:
                first = json.loads(ws.recv(timeout=10))
                assert first["type"] == "status"
            except ConnectionClosed:
                assert ws.close_code == 4400, (client_id, ws.close_code)
        time.sleep(0)

    check()


def test_a_hostile_client_key_in_the_base_url_is_refused_not_a_server_error(farm):
    @PROPERTY
    @given(key=texts.filter(bool), path=st.sampled_from(["queue", "prompt", "ws"]))
    def check(key: str, path: str) -> None:
        response = httpx.get(f"{farm.url}/comfy/k/{quoted(key)}/{path}", timeout=30)
        assert response.status_code in (401, 404), (key, path, response.status_code)

    check()
