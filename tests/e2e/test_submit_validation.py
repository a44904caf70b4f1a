"""Bad graphs and bad requests are refused with a clear 4xx naming the node; nothing is stored."""

from __future__ import annotations

import pytest

from tests.conftest import png, resize_graph, upload

pytestmark = pytest.mark.e2e


@pytest.fixture
def asset_id(owner):
    return upload(owner, png()).json()["id"]


def _counts():
    from apps.graphs.models import Graph
    from apps.runs.models import Run

    return Run.objects.count(), Graph.objects.count()


def _with(graph, node, **changes):
    graph["graph"]["nodes"][node].update(changes)
    return graph


CASES = {
    "unknown_node_type": lambda a: _with(resize_graph(a), "big", type="image/explode"),
    "unknown_param": lambda a: _with(resize_graph(a), "big",
                                     params={"width": 8, "height": 8, "sharpen": 2}),
    "unknown_input": lambda a: _with(resize_graph(a), "big",
                                     inputs={"picture": {"node": "src", "port": "image"}}),
    "unknown_node": lambda a: _with(resize_graph(a), "out",
                                    inputs={"image": {"node": "ghost", "port": "image"}}),
    "unknown_output": lambda a: _with(resize_graph(a), "out",
                                      inputs={"image": {"node": "big", "port": "mask"}}),
    "missing_input": lambda a: _with(resize_graph(a), "out", inputs={}),
    "missing_param": lambda a: _with(resize_graph(a), "big", params={"width": 8}),
    "param_range": lambda a: _with(resize_graph(a), "big", params={"width": 0, "height": 8}),
    "param_type": lambda a: _with(resize_graph(a), "big", params={"width": "wide", "height": 8}),
    "param_choice": lambda a: _with(resize_graph(a), "big",
                                    params={"width": 8, "height": 8, "method": "magic"}),
    "asset_not_found": lambda a: _with(resize_graph(a), "src",
                                       params={"asset": "00000000-0000-0000-0000-000000000000"}),
}
NODE_OF = {"unknown_node_type": "big", "unknown_param": "big", "unknown_input": "big",
           "unknown_node": "out", "unknown_output": "out", "missing_input": "out",
           "missing_param": "big", "param_range": "big", "param_type": "big",
           "param_choice": "big", "asset_not_found": "src"}


@pytest.mark.parametrize("code", sorted(CASES))
def test_an_invalid_graph_is_a_422_naming_the_node(owner, asset_id, db_access, code):
    before = _counts()
    response = owner.post("/v1/runs", json=CASES[code](asset_id))
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert (error["code"], error["nodeId"]) == (code, NODE_OF[code])
    assert error["message"]
    assert _counts() == before


def test_a_kind_mismatch_names_both_kinds(owner, asset_id):
    graph = resize_graph(asset_id)
    graph["graph"]["nodes"]["txt"] = {"type": "input/text", "params": {"value": "hi"}}
    graph["graph"]["nodes"]["out"]["inputs"] = {"image": {"node": "txt", "port": "text"}}
    error = owner.post("/v1/runs", json=graph).json()["error"]
    assert (error["code"], error["nodeId"]) == ("kind_mismatch", "out")
    assert "image" in error["message"] and "text" in error["message"]


def test_a_cycle_is_refused(owner, asset_id):
    graph = resize_graph(asset_id)
    nodes = graph["graph"]["nodes"]
    nodes["a"] = {"type": "image/resize", "params": {"width": 8, "height": 8},
                  "inputs": {"image": {"node": "b", "port": "image"}}}
    nodes["b"] = {"type": "image/resize", "params": {"width": 8, "height": 8},
                  "inputs": {"image": {"node": "a", "port": "image"}}}
    error = owner.post("/v1/runs", json=graph).json()["error"]
    assert error["code"] == "cycle" and error["nodeId"] in ("a", "b")


def test_a_target_outside_the_graph_is_refused(owner, asset_id):
    response = owner.post("/v1/runs", json={**resize_graph(asset_id), "target": "nowhere"})
    assert response.status_code == 422
    assert response.json()["error"] == {
        "code": "unknown_target", "message": "target 'nowhere' is not a node of the graph",
        "nodeId": "nowhere",
    }


def test_malformed_json_is_a_clear_4xx(owner, db_access):
    before = _counts()
    response = owner.post("/v1/runs", content=b'{"graph": {', headers={
        "Content-Type": "application/json"})
    assert 400 <= response.status_code < 500
    assert response.json()["error"]["code"] in ("bad_request", "invalid_request")
    assert "Traceback" not in response.text
    assert _counts() == before


def test_a_body_that_is_not_json_is_a_clear_4xx(owner):
    response = owner.post("/v1/runs", content=b"graph=1", headers={
        "Content-Type": "application/x-www-form-urlencoded"})
    assert 400 <= response.status_code < 500
    assert response.json()["error"]["code"] in ("bad_request", "invalid_request")
    assert response.json()["error"]["message"] and "Traceback" not in response.text


def test_a_graph_missing_its_nodes_is_a_422(owner):
    response = owner.post("/v1/runs", json={"graph": {}, "target": "out"})
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_request"


def test_a_bad_node_shape_names_the_node(owner):
    response = owner.post("/v1/runs", json={"graph": {"nodes": {"n1": {"params": {}}}},
                                            "target": "n1"})
    assert response.status_code == 422
    assert response.json()["error"]["nodeId"] == "n1"


def test_an_upload_that_is_not_an_image_is_a_415(owner):
    response = upload(owner, b"%PDF-1.4 not an image", name="doc.pdf",
                      content_type="application/pdf")
    assert response.status_code == 415
    assert response.json()["error"]["code"] == "unsupported_media_type"


def test_an_upload_over_the_size_limit_is_a_413(owner, db_access):
    from apps.takes.models import Asset

    before = Asset.objects.count()
    response = upload(owner, png(8, 8) + b"\0" * 3_000_000)  # the test farm's limit is 2 MB
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "too_large"
    assert Asset.objects.count() == before


def test_uploads_are_content_addressed(owner):
    first = upload(owner, png(10, 10, (9, 9, 9)))
    again = upload(owner, png(10, 10, (9, 9, 9)), name="other-name.png")
    assert first.status_code == 201 and again.status_code == 200
    assert first.json()["id"] == again.json()["id"]
    assert first.json()["mediaType"] == "image/png" and first.json()["size"] > 0


def test_an_upload_without_a_file_is_a_422(owner):
    response = owner.post("/v1/assets", data={"nothing": "here"})
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "invalid_request" and "file" in error["message"]


def test_an_unknown_route_is_a_json_404(owner):
    response = owner.get("/v1/nothing-here")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
