"""Every bad input is a clean 4xx in the error shape, never a 500, and nothing is stored
(issue 9, items 1–5, 8, 10, 11)."""

from __future__ import annotations

import io
import json
import random

import pytest
from PIL import Image

from tests.api.conftest import assert_error, raw_json
from tests.conftest import png, resize_graph, upload

pytestmark = pytest.mark.e2e

JSON = {"Content-Type": "application/json"}


@pytest.fixture
def asset_id(owner):
    return upload(owner, png(24, 24, (10, 120, 200))).json()["id"]


def _stored():
    from apps.graphs.models import Graph
    from apps.runs.models import Run

    return Run.objects.count(), Graph.objects.count()


def _submit_raw(client, body):
    return client.post("/v1/runs", content=raw_json(body), headers=JSON)


def _with_label(asset_id, label, **extra):
    body = resize_graph(asset_id, 16, 16, **extra)
    body["graph"]["nodes"]["out"]["params"] = {"label": label}
    return body


# --- 1. query bounds --------------------------------------------------------------------------

def test_an_offset_past_any_listing_is_a_422_not_a_database_error(owner):
    assert_error(owner.get("/v1/runs", params={"offset": "99999999999999999999"}), 422,
                 "invalid_request")
    assert_error(owner.get("/v1/runs", params={"offset": str(2**63)}), 422)
    assert owner.get("/v1/runs", params={"offset": "1000000000"}).json()["items"] == []


# --- 2. multipart without a boundary ----------------------------------------------------------

def test_a_multipart_upload_without_a_boundary_is_a_400(owner):
    response = owner.post("/v1/assets", content=b"--x\r\n\r\nnot really\r\n--x--\r\n",
                          headers={"Content-Type": "multipart/form-data"})
    assert_error(response, 400, "bad_request")


# --- 3. text PostgreSQL cannot store ----------------------------------------------------------

@pytest.mark.parametrize(("where", "node"), [
    ("label-nul", "out"), ("label-surrogate", "out"), ("node-id-as-target", "bad\x00id"),
    ("input-ref", "out"), ("client-run-id", None), ("nested-param-key", "out"),
])
def test_nul_and_lone_surrogates_are_a_422_naming_the_node(owner, asset_id, db_access, where,
                                                          node):
    body = _with_label(asset_id, "ok")
    nodes = body["graph"]["nodes"]
    if where == "label-nul":
        nodes["out"]["params"]["label"] = "a\x00b"
    elif where == "label-surrogate":
        nodes["out"]["params"]["label"] = "a\ud800b"
    elif where == "node-id-as-target":
        nodes["bad\x00id"] = nodes.pop("out")
        body["target"] = "bad\x00id"
    elif where == "input-ref":
        nodes["out"]["inputs"]["image"]["node"] = "big\x00"
    elif where == "client-run-id":
        body["clientRunId"] = "key-\x00"
    elif where == "nested-param-key":
        nodes["out"]["params"]["label"] = {"\ud83d": 1}
    before = _stored()
    error = assert_error(_submit_raw(owner, body), 422, "invalid_text")
    assert error.get("nodeId") == node, error
    assert _stored() == before


# --- 4. NaN and ±Infinity ---------------------------------------------------------------------

@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_infinity_are_a_422_naming_the_node(owner, asset_id, db_access, value):
    body = resize_graph(asset_id, 16, 16)
    body["graph"]["nodes"]["num"] = {"type": "input/float", "params": {"value": value}}
    before = _stored()
    error = assert_error(_submit_raw(owner, body), 422, "param_type")
    assert error["nodeId"] == "num"
    assert "finite" in error["message"]

    body = resize_graph(asset_id, 16, 16)
    body["graph"]["nodes"]["wait"] = {"type": "util/delay", "params": {"seconds": value},
                                      "inputs": {"image": {"node": "src", "port": "image"}}}
    assert assert_error(_submit_raw(owner, body), 422, "param_type")["nodeId"] == "wait"
    assert _stored() == before


def test_an_integer_too_large_for_a_float_is_a_422(owner, asset_id):
    body = resize_graph(asset_id, 16, 16)
    body["graph"]["nodes"]["num"] = {"type": "input/float", "params": {"value": 10**400}}
    response = owner.post("/v1/runs", content=json.dumps(body), headers=JSON)
    assert assert_error(response, 422)["nodeId"] == "num"


# --- 5. bodies over the limit -----------------------------------------------------------------

def test_a_body_over_the_limit_is_a_413(owner):
    from django.conf import settings

    huge = b'{"graph": {"nodes": {}}, "target": "' + b"x" * (60 * 1024 * 1024) + b'"}'
    assert_error(owner.post("/v1/runs", content=huge, headers=JSON), 413, "too_large")
    just_over = b" " * (settings.INLINE_MAX_BODY_BYTES + 1)
    assert_error(owner.post("/v1/runs", content=just_over, headers=JSON), 413, "too_large")

    # Chunked, without a Content-Length: the buffered size counts.
    def chunks():
        for _ in range(settings.INLINE_MAX_BODY_BYTES // 65536 + 2):
            yield b" " * 65536

    assert_error(owner.post("/v1/runs", content=chunks(), headers=JSON), 413, "too_large")



def test_an_upload_may_exceed_the_body_limit_up_to_the_asset_limit(strict_web, owner_token):
    """On a web whose body limit (1 MiB) is below its asset limit (2,000,000 bytes)."""
    noise = Image.frombytes("RGB", (790, 790), random.Random(9).randbytes(790 * 790 * 3))
    out = io.BytesIO()
    noise.save(out, format="PNG")
    data = out.getvalue()
    assert 1024 * 1024 < len(data) < 2_000_000
    client = strict_web.client(owner_token)
    response = upload(client, data)
    assert response.status_code in (200, 201), response.text
    assert response.json()["size"] == len(data)
    assert_error(client.post("/v1/runs", content=b" " * len(data), headers=JSON), 413, "too_large")
    assert_error(upload(client, data + b"\0" * 200_000), 413, "too_large")


# --- 8. priority is an integer, not anything that coerces to one -----------------------------

@pytest.mark.parametrize("priority", [True, False, "5", 1.5, None])
def test_a_priority_of_the_wrong_type_is_a_422(owner, asset_id, db_access, priority):
    before = _stored()
    response = owner.post("/v1/runs", json=resize_graph(asset_id, 16, 16, priority=priority))
    assert_error(response, 422, "invalid_request")
    assert "priority" in response.json()["error"]["message"]
    assert _stored() == before


# --- 10. every string param is bounded --------------------------------------------------------

def test_a_prompt_over_its_bound_is_a_422_and_a_10_mb_one_never_reaches_the_farm(owner, db_access):
    from apps.graphs.nodes import MAX_PROMPT

    def prompt_graph(prompt):
        return {"graph": {"nodes": {
            "text": {"type": "input/text", "params": {"value": prompt}},
        }}, "target": "text"}

    before = _stored()
    error = assert_error(owner.post("/v1/runs", json=prompt_graph("p" * (MAX_PROMPT + 1))), 422,
                         "param_too_long")
    assert error["nodeId"] == "text" and str(MAX_PROMPT) in error["message"]
    big = owner.post("/v1/runs", json=prompt_graph("p" * (10 * 1024 * 1024)))
    assert_error(big, 413, "too_large")
    assert len(big.content) < 1024  # the answer does not echo the prompt back
    assert _stored() == before

    descriptors = {d["type"]: d for d in owner.get("/v1/models").json()["nodes"]}
    for descriptor in descriptors.values():
        for param in descriptor["params"]:
            if param["type"] in ("string", "enum", "asset", "model"):
                assert isinstance(param["maxLength"], int), (descriptor["type"], param)
    assert {p["name"]: p["maxLength"] for p in descriptors["zimage/turbo"]["params"]}["prompt"] \
        == MAX_PROMPT


# --- 11. a label is bounded, so takes and listings are too ------------------------------------

def test_a_label_is_bounded_so_every_take_and_listing_stays_small(persona, asset_id, db_access):
    from apps.graphs.nodes import MAX_LABEL

    client = persona("labeller")
    asset = upload(client, png(24, 24, (10, 120, 200))).json()["id"]
    error = assert_error(client.post("/v1/runs", json=_with_label(asset, "L" * (MAX_LABEL + 1))),
                         422, "param_too_long")
    assert error["nodeId"] == "out"

    run_ids = []
    for n in range(3):
        response = client.post("/v1/runs", json=_with_label(asset, f"{n}" * MAX_LABEL))
        assert response.status_code == 201, response.text
        run_ids.append(response.json()["runId"])
    for run_id in run_ids:
        assert client.wait_run(run_id)["status"] == "succeeded"
    listing = client.get("/v1/runs")
    assert len(listing.json()["items"]) == 3
    # Three runs with one take each, labels at their bound: a few KiB, not megabytes.
    assert len(listing.content) < 3 * 4096, len(listing.content)
