"""/v1/models: descriptors with a registry version, served with ETag / 304."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.e2e


def test_models_lists_the_vocabulary_with_an_etag(owner):
    response = owner.get("/v1/models")
    body = response.json()
    assert response.headers["etag"] == f'"{body["registryVersion"]}"'
    types = {n["type"] for n in body["nodes"]}
    assert {"image/load", "image/resize", "image/crop", "image/save", "zimage/turbo", "sample",
            "input/text", "load/vae"} <= types
    resize = next(n for n in body["nodes"] if n["type"] == "image/resize")
    assert resize["inputs"] == [{"name": "image", "kind": "image", "required": True},
                                {"name": "width", "kind": "int", "required": False},
                                {"name": "height", "kind": "int", "required": False}]
    switch = next(n for n in body["nodes"] if n["type"] == "switch/image")
    assert [p.get("lazy", False) for p in switch["inputs"]] == [False, True, True]
    preview = next(n for n in body["nodes"] if n["type"] == "util/preview")
    assert preview["showsValue"] and preview["inputs"][0]["accepts"] == ["int", "float", "bool"]
    width = next(p for p in resize["params"] if p["name"] == "width")
    assert {k: width[k] for k in ("type", "required", "min")} == {"type": "int", "required": True,
                                                                  "min": 1}
    assert owner.get("/v1/models", headers={"If-None-Match": response.headers["etag"]}
                     ).status_code == 304


def test_one_descriptor_by_type(owner):
    assert owner.get("/v1/models/image/crop").json()["type"] == "image/crop"
    missing = owner.get("/v1/models/image/explode")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "unknown_node_type"
