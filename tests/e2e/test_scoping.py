"""Every read is scoped: strangers get 404, teammates and staff see, no token is a 401."""

from __future__ import annotations

import hashlib

import pytest

from tests.conftest import png, resize_graph, upload

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def finished(farm, personas):
    from tests.conftest import _client

    with _client(farm, personas["owner"]) as owner:
        asset = upload(owner, png(12, 12, (1, 1, 200))).json()
        run = owner.wait_run(owner.post("/v1/runs", json=resize_graph(asset["id"], 8, 8))
                             .json()["runId"])
        return {"run": run, "asset": asset, "take": run["takes"][0]}


def test_a_stranger_cannot_read_my_run_take_or_asset(outsider, finished):
    for path in (f"/v1/runs/{finished['run']['id']}", f"/v1/takes/{finished['take']['id']}",
                 f"/v1/takes/{finished['take']['id']}/bytes",
                 f"/v1/assets/{finished['asset']['id']}"):
        response = outsider.get(path)
        assert response.status_code == 404, path
        assert response.json()["error"]["code"] == "not_found"


def test_a_stranger_cannot_cancel_my_run(outsider, owner, finished):
    refused = outsider.delete(f"/v1/runs/{finished['run']['id']}")
    assert refused.status_code == 404
    assert refused.json()["error"]["code"] == "not_found"
    # Word for word what a run id that names nothing gets: the run's existence does not leak.
    nobody = "00000000-0000-4000-8000-000000000000"
    assert refused.text.replace(finished["run"]["id"], nobody) == outsider.delete(
        f"/v1/runs/{nobody}").text
    assert owner.get(f"/v1/runs/{finished['run']['id']}").json()["status"] == "succeeded"


def test_a_stranger_does_not_see_my_runs_in_a_list(outsider, finished):
    ids = {r["id"] for r in outsider.get("/v1/runs?limit=200").json()["items"]}
    assert finished["run"]["id"] not in ids


def test_a_stranger_cannot_use_my_asset_in_a_graph(outsider, finished):
    response = outsider.post("/v1/runs", json=resize_graph(finished["asset"]["id"]))
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "asset_not_found"


def test_a_teammate_can_read_my_run_and_take(owner, teammate, finished):
    run = teammate.get(f"/v1/runs/{finished['run']['id']}")
    assert run.status_code == 200 and run.json() == owner.get(
        f"/v1/runs/{finished['run']['id']}").json()
    assert [t["id"] for t in run.json()["takes"]] == [finished["take"]["id"]]
    take = teammate.get(f"/v1/takes/{finished['take']['id']}")
    assert take.status_code == 200 and take.json()["sha256"] == finished["take"]["sha256"]
    data = teammate.get(f"/v1/takes/{finished['take']['id']}/bytes")
    assert data.status_code == 200 and data.headers["content-type"] == "image/png"
    assert data.content == owner.get(f"/v1/takes/{finished['take']['id']}/bytes").content
    assert hashlib.sha256(data.content).hexdigest() == finished["take"]["sha256"]


def test_staff_see_everything(farm, personas, finished):
    from tests.conftest import _client

    with _client(farm, personas["staff"]) as staff:
        run = staff.get(f"/v1/runs/{finished['run']['id']}")
        assert run.status_code == 200
        assert (run.json()["id"], run.json()["status"]) == (finished["run"]["id"], "succeeded")
        assert [t["id"] for t in run.json()["takes"]] == [finished["take"]["id"]]
        take = staff.get(f"/v1/takes/{finished['take']['id']}")
        assert take.status_code == 200 and take.json()["runId"] == finished["run"]["id"]
        asset = staff.get(f"/v1/assets/{finished['asset']['id']}")
        assert asset.status_code == 200 and asset.json()["sha256"] == finished["asset"]["sha256"]


def test_no_token_is_a_401_everywhere_but_health_and_docs(anonymous, finished):
    for method, path in (("GET", "/v1/runs"), ("POST", "/v1/runs"),
                         ("GET", f"/v1/runs/{finished['run']['id']}"),
                         ("GET", f"/v1/takes/{finished['take']['id']}/bytes"),
                         ("GET", "/v1/models"), ("POST", "/v1/assets")):
        response = anonymous.request(method, path)
        assert response.status_code == 401, (method, path)
        assert response.json()["error"]["code"] == "unauthorized"
    assert anonymous.get("/v1/health").status_code == 200
    assert anonymous.get("/v1/openapi.json").status_code == 200
    assert anonymous.get("/v1/docs").status_code == 200


def test_a_wrong_token_is_a_401(farm):
    from tests.conftest import _client

    with _client(farm, "inf_not-a-real-token") as client:
        response = client.get("/v1/runs")
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "unauthorized"
        assert "items" not in response.json()


def test_a_malformed_id_is_a_404(owner):
    for path in ("/v1/runs/not-a-uuid", "/v1/takes/123", "/v1/assets/x"):
        response = owner.get(path)
        assert response.status_code == 404, path
        assert response.json()["error"]["code"] == "not_found", path


def test_my_run_list_paginates_and_filters_by_status(owner, finished):
    owner.wait_run(owner.post("/v1/runs", json=resize_graph(finished["asset"]["id"], 7, 7))
                   .json()["runId"])
    page = owner.get("/v1/runs?limit=1").json()
    assert len(page["items"]) == 1 and page["nextOffset"] == 1
    succeeded = owner.get("/v1/runs?status=succeeded&limit=200").json()["items"]
    assert succeeded and all(r["status"] == "succeeded" for r in succeeded)
    bogus = owner.get("/v1/runs?status=bogus")
    assert bogus.status_code == 422
    assert bogus.json()["error"]["code"] == "invalid_request"
