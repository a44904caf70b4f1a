"""clientRunId idempotency and coalescing of identical in-flight runs."""

from __future__ import annotations

import uuid

import pytest

from tests.conftest import delay_graph, png, resize_graph, upload

pytestmark = pytest.mark.e2e


@pytest.fixture
def asset_id(owner):
    return upload(owner, png(20, 20, (5, 80, 5))).json()["id"]


def test_the_same_client_run_id_and_graph_returns_the_same_run(owner, asset_id):
    key = str(uuid.uuid4())
    first = owner.post("/v1/runs", json=resize_graph(asset_id, 8, 8, clientRunId=key))
    owner.wait_run(first.json()["runId"])
    again = owner.post("/v1/runs", json=resize_graph(asset_id, 8, 8, clientRunId=key))
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["runId"] == first.json()["runId"]


def test_the_same_client_run_id_with_another_graph_is_a_409(owner, asset_id, db_access):
    from apps.runs.models import Run

    key = str(uuid.uuid4())
    owner.post("/v1/runs", json=resize_graph(asset_id, 8, 8, clientRunId=key))
    before = Run.objects.count()
    clash = owner.post("/v1/runs", json=resize_graph(asset_id, 9, 9, clientRunId=key))
    assert clash.status_code == 409
    assert clash.json()["error"]["code"] == "client_run_id_conflict"
    assert Run.objects.count() == before


def test_an_identical_graph_in_flight_is_coalesced_onto_one_run(owner, asset_id):
    graph = delay_graph(asset_id, 1.5)
    first = owner.post("/v1/runs", json=graph)
    second = owner.post("/v1/runs", json=graph)
    assert second.status_code == 200
    assert second.json()["runId"] == first.json()["runId"]
    done = owner.wait_run(first.json()["runId"])
    assert done["status"] == "succeeded"
    third = owner.post("/v1/runs", json=graph)  # no longer in flight: a new run
    assert third.status_code == 201 and third.json()["runId"] != first.json()["runId"]
    owner.delete(f"/v1/runs/{third.json()['runId']}")


def test_identical_graphs_of_two_users_are_not_coalesced(owner, teammate, asset_id):
    mine = owner.post("/v1/runs", json=delay_graph(asset_id, 0.5)).json()["runId"]
    theirs = teammate.post("/v1/runs", json=delay_graph(asset_id, 0.5))
    assert theirs.status_code == 201 and theirs.json()["runId"] != mine
    owner.wait_run(mine)
    teammate.wait_run(theirs.json()["runId"])


def test_a_user_over_their_in_flight_limit_gets_a_429(farm, db_access):
    from apps.accounts.models import UserLimits
    from apps.accounts.services import token_create, user_get_or_create
    from tests.conftest import _client

    user = user_get_or_create(username="limited")
    UserLimits.objects.update_or_create(user=user, defaults={"max_inflight_runs": 1})
    with _client(farm, token_create(user=user)[1]) as limited:
        asset = upload(limited, png(12, 12, (4, 4, 4))).json()["id"]
        first = limited.post("/v1/runs", json=delay_graph(asset, 1.0))
        second = limited.post("/v1/runs", json=delay_graph(asset, 1.1))
        assert first.status_code == 201
        assert second.status_code == 429 and second.json()["error"]["code"] == "too_many_runs"
        limited.wait_run(first.json()["runId"])
        assert limited.post("/v1/runs", json=delay_graph(asset, 0.1)).status_code == 201
