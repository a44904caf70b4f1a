"""Every read is scoped: strangers get 404, teammates and staff see, no token is a 401."""

from __future__ import annotations

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


def test_a_stranger_cannot_cancel_my_run(outsider, finished):
    assert outsider.delete(f"/v1/runs/{finished['run']['id']}").status_code == 404


def test_a_stranger_does_not_see_my_runs_in_a_list(outsider, finished):
    ids = {r["id"] for r in outsider.get("/v1/runs?limit=200").json()["items"]}
    assert finished["run"]["id"] not in ids


def test_a_stranger_cannot_use_my_asset_in_a_graph(outsider, finished):
    response = outsider.post("/v1/runs", json=resize_graph(finished["asset"]["id"]))
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "asset_not_found"


def test_a_teammate_can_read_my_run_and_take(teammate, finished):
    assert teammate.get(f"/v1/runs/{finished['run']['id']}").status_code == 200
    assert teammate.get(f"/v1/takes/{finished['take']['id']}/bytes").status_code == 200


def test_staff_see_everything(farm, personas, finished):
    from tests.conftest import _client

    with _client(farm, personas["staff"]) as staff:
        assert staff.get(f"/v1/runs/{finished['run']['id']}").status_code == 200


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
        assert client.get("/v1/runs").status_code == 401


def test_a_malformed_id_is_a_404(owner):
    assert owner.get("/v1/runs/not-a-uuid").status_code == 404
    assert owner.get("/v1/takes/123").status_code == 404


def test_my_run_list_paginates_and_filters_by_status(owner, finished):
    owner.wait_run(owner.post("/v1/runs", json=resize_graph(finished["asset"]["id"], 7, 7))
                   .json()["runId"])
    page = owner.get("/v1/runs?limit=1").json()
    assert len(page["items"]) == 1 and page["nextOffset"] == 1
    succeeded = owner.get("/v1/runs?status=succeeded&limit=200").json()["items"]
    assert succeeded and all(r["status"] == "succeeded" for r in succeeded)
    assert owner.get("/v1/runs?status=bogus").status_code == 422
