"""The /v1 contract at its edges: 405 and HEAD, Retry-After, a schema that declares every
response, docs served by the farm itself, and safe host/cookie settings (issue 9, items 13–17)."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.api.conftest import assert_error
from tests.conftest import delay_graph, png, upload

pytestmark = pytest.mark.e2e


# --- 13. 405 in the error shape; HEAD answers like GET ----------------------------------------

def test_a_method_a_route_does_not_have_is_a_405_in_the_error_shape(owner):
    response = owner.put("/v1/runs")
    error = assert_error(response, 405, "method_not_allowed")
    assert "PUT" in error["message"]
    assert set(response.headers["Allow"].replace(" ", "").split(",")) == {"GET", "POST", "HEAD"}
    assert_error(owner.patch("/v1/health"), 405, "method_not_allowed")
    assert_error(owner.delete("/v1/assets"), 405, "method_not_allowed")


def test_head_on_a_get_route_answers_like_get_without_a_body(owner, anonymous):
    for client, path in ((anonymous, "/v1/health"), (owner, "/v1/runs"), (owner, "/v1/models")):
        get, head = client.get(path), client.head(path)
        assert (head.status_code, head.content) == (get.status_code, b""), path
        assert head.headers["content-type"] == get.headers["content-type"]
        assert int(head.headers["content-length"]) > 0
    assert anonymous.head("/v1/runs").status_code == 401


# --- 14. 429 carries Retry-After --------------------------------------------------------------

def test_a_429_carries_retry_after(persona):
    client = persona("impatient", max_inflight_runs=1)
    asset = upload(client, png(16, 16, (1, 2, 3))).json()["id"]
    first = client.post("/v1/runs", json=delay_graph(asset, 3))
    assert first.status_code == 201, first.text
    second = client.post("/v1/runs", json=delay_graph(asset, 2.5))
    assert_error(second, 429, "too_many_runs")
    assert int(second.headers["Retry-After"]) > 0
    client.delete(f"/v1/runs/{first.json()['runId']}")


# --- 15. the schema declares every response ---------------------------------------------------

def test_every_operation_declares_its_responses_and_errors(anonymous):
    schema = anonymous.get("/v1/openapi.json").json()
    operations = [(method, path, op) for path, ops in schema["paths"].items()
                  for method, op in ops.items()]
    assert len(operations) >= 12
    for method, path, op in operations:
        statuses = {int(s): r for s, r in op["responses"].items()}
        ok = [s for s in statuses if 200 <= s < 300]
        assert ok, (method, path)
        for status in ok:
            content = statuses[status].get("content", {})
            assert content and all("schema" in c for c in content.values()), (method, path, status)
            assert any(c["schema"] != {} for c in content.values()), (method, path, status)
        errors = [s for s in statuses if s >= 400]
        assert errors, (method, path)
        if path == "/v1/health":  # no auth, no input: it answers 200 or 503 (its own body)
            continue
        assert 401 in statuses, (method, path)
        for status in errors:
            ref = statuses[status]["content"]["application/json"]["schema"]["$ref"]
            body = schema["components"]["schemas"][ref.rsplit("/", 1)[1]]
            assert "error" in body["properties"], (method, path, status)


# --- 16. the docs page loads nothing from outside the farm ------------------------------------

def test_the_docs_page_loads_its_assets_from_the_farm(anonymous):
    page = anonymous.get("/v1/docs")
    assert page.status_code == 200
    urls = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert urls, page.text
    assert not [u for u in urls if re.match(r"(https?:)?//", u)], urls
    for url in urls:
        asset = anonymous.get(url)
        assert asset.status_code == 200, url
        assert len(asset.content) > 100, url
    assert any(u.endswith("swagger-ui-bundle.js") for u in urls)


# --- 17. hosts and cookies --------------------------------------------------------------------

def test_an_unknown_host_is_a_400_and_localhost_names_work(farm):
    for host in ("127.0.0.1", "localhost"):
        assert httpx.get(f"{farm.url}/v1/health", headers={"Host": host}).status_code == 200
    evil = httpx.get(f"{farm.url}/v1/health", headers={"Host": "evil.example"})
    assert_error(evil, 400, "bad_request")


def test_cookies_are_secure_behind_tls_when_configured(farm, strict_web):
    plain = httpx.get(f"{farm.url}/admin/login/")
    assert "csrftoken=" in plain.headers["set-cookie"]
    assert "Secure" not in plain.headers["set-cookie"]
    behind_tls = httpx.get(f"{strict_web.url}/admin/login/",
                           headers={"X-Forwarded-Proto": "https"})
    assert behind_tls.status_code == 200
    assert "csrftoken=" in behind_tls.headers["set-cookie"]
    assert "Secure" in behind_tls.headers["set-cookie"]
    # The proxy header makes the request secure as Django sees it (redirects keep https).
    login = httpx.get(f"{strict_web.url}/admin/", headers={"X-Forwarded-Proto": "https"})
    assert login.status_code == 302
    assert login.headers["location"].startswith("/admin/login/")


def test_api_responses_keep_the_security_headers_and_set_no_browser_state(farm, owner):
    """/v1 answers carry the same security headers as the admin's and never a cookie or
    Vary: Cookie (a Bearer-token API never reads a session); the admin still gets its CSRF
    cookie."""
    for response in (owner.get("/v1/runs"), owner.get("/v1/runs/00000000-0000-0000-0000-0000000"
                                                      "00000"), owner.post("/v1/runs", json={})):
        assert response.headers["x-frame-options"] == "DENY"
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["referrer-policy"] == "same-origin"
        assert "set-cookie" not in response.headers
        assert "cookie" not in response.headers.get("vary", "").lower()
    admin = httpx.get(f"{farm.url}/admin/login/")
    assert admin.headers["x-frame-options"] == "DENY" and "csrftoken=" in admin.headers["set-cookie"]


# --- response models never drop a field -------------------------------------------------------

def test_declared_response_models_keep_fields_they_do_not_declare(owner):
    """DESIGN.md: fields are added freely, never removed: a take's lineage (graphSha256,
    nodeType, params…) is not in TakeOut, and must still reach clients everywhere."""
    asset = upload(owner, png(12, 12, (9, 9, 9))).json()["id"]
    body = {"graph": {"nodes": {
        "src": {"type": "image/load", "params": {"asset": asset}},
        "out": {"type": "image/save", "params": {"label": "kept"},
                "inputs": {"image": {"node": "src", "port": "image"}}},
    }}, "target": "out"}
    run = owner.wait_run(owner.post("/v1/runs", json=body).json()["runId"])
    assert run["status"] == "succeeded", run
    take = run["takes"][0]
    assert take.get("graphSha256") and take.get("nodeType") == "image/save", take
    assert owner.get(f"/v1/takes/{take['id']}").json() == take
    listed = owner.get("/v1/runs", params={"limit": 200}).json()["items"]
    assert next(r for r in listed if r["id"] == run["id"])["takes"] == [take]


# --- video takes: the take's clip fields and its poster are in the schema ---------------------

def test_the_take_schema_declares_the_clip_fields_and_the_poster_route(anonymous, owner):
    schema = anonymous.get("/v1/openapi.json").json()
    take = schema["components"]["schemas"]["TakeOut"]
    for name in ("frameCount", "fps", "durationSeconds", "audioSeconds", "posterUrl"):
        assert name in take["required"], name
    nullable = {p["type"] for p in take["properties"]["frameCount"]["anyOf"]}
    assert nullable == {"integer", "null"}
    poster = schema["paths"]["/v1/takes/{take_id}/poster"]["get"]["responses"]
    assert set(poster["200"]["content"]) == {"image/png"}
    assert_error(owner.get("/v1/takes/00000000-0000-0000-0000-000000000000/poster"), 404,
                 "not_found")
    assert_error(anonymous.get("/v1/takes/00000000-0000-0000-0000-000000000000/poster"), 401)
