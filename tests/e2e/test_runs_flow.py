"""The farm end to end over HTTP: a real server, a real worker, real Postgres and broker."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from tests.conftest import png, resize_graph, upload

pytestmark = pytest.mark.e2e


def test_a_resize_graph_renders_a_take_of_the_requested_size(owner):
    asset = upload(owner, png(64, 48)).json()
    submitted = owner.post("/v1/runs", json=resize_graph(asset["id"], 40, 24))
    assert submitted.status_code == 201, submitted.text
    run = owner.wait_run(submitted.json()["runId"])
    assert run["status"] == "succeeded", run
    [take] = run["takes"]
    assert (take["nodeId"], take["width"], take["height"]) == ("out", 40, 24)

    got = owner.get(f"/v1/takes/{take['id']}/bytes")
    assert got.status_code == 200
    assert got.headers["content-type"] == "image/png"
    assert got.headers["etag"] == f'"{take["sha256"]}"'
    assert Image.open(io.BytesIO(got.content)).size == (40, 24)
    assert owner.get(f"/v1/takes/{take['id']}/bytes",
                     headers={"If-None-Match": got.headers["etag"]}).status_code == 304


def test_the_event_log_records_each_node_and_the_end(owner, db_access):
    from apps.runs.models import RunEvent

    asset = upload(owner, png(30, 30, (1, 2, 3))).json()
    run_id = owner.post("/v1/runs", json=resize_graph(asset["id"], 16, 16)).json()["runId"]
    owner.wait_run(run_id)
    events = list(RunEvent.objects.filter(run_id=run_id).values_list("seq", "type", "payload"))
    assert [seq for seq, _, _ in events] == list(range(1, len(events) + 1))
    types = [t for _, t, _ in events]
    assert types[0] == "status" and types[-1] == "run_done"
    assert [p["nodeId"] for _, t, p in events if t == "node_done"] == ["src", "big", "out"]
