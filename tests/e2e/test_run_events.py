"""Live run events over the websocket (GET /v1/runs/{id}/events) against a real server + worker."""

from __future__ import annotations

import itertools
import json
import time
from typing import Any
from urllib.parse import urlencode

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect
from websockets.typing import Subprotocol

from tests.conftest import png, upload
from tests.livefarm import Client, LiveFarm


def protocols(*names: str) -> list[Subprotocol]:
    return [Subprotocol(name) for name in names]

pytestmark = pytest.mark.e2e

_colors = itertools.count(1)


def events_url(farm: LiveFarm, run_id: str, **query: Any) -> str:
    base = farm.url.replace("http://", "ws://", 1) + f"/v1/runs/{run_id}/events"
    return f"{base}?{urlencode(query)}" if query else base


def open_events(farm: LiveFarm, run_id: str, token: str | None, **query: Any) -> ClientConnection:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return connect(events_url(farm, run_id, **query), additional_headers=headers, open_timeout=10)


def read_until_closed(ws: ClientConnection, timeout: float = 30, timed: bool = False) -> Any:
    """Every message until the server closes: (messages, close code[, arrival times])."""
    messages, arrivals = [], []
    try:
        while True:
            messages.append(json.loads(ws.recv(timeout=timeout)))
            arrivals.append(time.monotonic())
    except ConnectionClosed as closed:
        code = closed.rcvd.code if closed.rcvd else None
    return (messages, code, arrivals) if timed else (messages, code)


def close_code_of(url: str, **connect_args: Any) -> int | None:
    with connect(url, open_timeout=10, **connect_args) as ws:
        messages, code = read_until_closed(ws, timeout=10)
    assert messages == []
    return code


def delay_run(client: Client, seconds: float) -> str:
    """Submit load → delay(seconds) → save on a fresh asset (a fresh asset dodges the node cache)."""
    color = next(_colors)
    asset = upload(client, png(8, 8, (color % 256, color // 256 % 256, 77))).json()
    body = {
        "graph": {"nodes": {
            "src": {"type": "image/load", "params": {"asset": asset["id"]}},
            "wait": {"type": "util/delay", "params": {"seconds": seconds},
                     "inputs": {"image": {"node": "src", "port": "image"}}},
            "out": {"type": "image/save", "inputs": {"image": {"node": "wait", "port": "image"}}},
        }},
        "target": "out",
    }
    submitted = client.post("/v1/runs", json=body)
    assert submitted.status_code == 201, submitted.text
    return submitted.json()["runId"]


def logged(run_id: str) -> list[dict]:
    """The run's durable event log in its wire shape."""
    from apps.runs.events import event_to_wire
    from apps.runs.models import RunEvent

    return [event_to_wire(e) for e in RunEvent.objects.filter(run_id=run_id).order_by("seq")]


def test_a_client_from_the_start_receives_the_whole_log_in_order(farm, owner, personas, db_access):
    from apps.runs.models import Run

    run_id = delay_run(owner, 4.0)
    with open_events(farm, run_id, personas["owner"], after=0) as ws:
        messages = [json.loads(ws.recv(timeout=30))]
        while messages[-1]["type"] != "progress":
            messages.append(json.loads(ws.recv(timeout=30)))
        # Live, not caught up from the log in bursts at the end: progress arrives while the
        # run is still running (its delay node reports every 0.1 s for 4 s).
        status_at_first_progress = Run.objects.get(pk=run_id).status
        rest, code = read_until_closed(ws)
    messages += rest

    snapshot, events = messages[0], messages[1:]
    assert snapshot["type"] == "snapshot" and snapshot["runId"] == run_id
    assert snapshot["seq"] == snapshot["lastSeq"] == snapshot["run"]["lastSeq"]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert all(e["runId"] == run_id for e in events)
    assert events[0] == {**events[0], "type": "status", "status": "running"}
    assert [e["nodeId"] for e in events if e["type"] == "node_done"] == ["src", "wait", "out"]
    assert sum(e["type"] == "progress" for e in events) >= 5
    assert events[-1]["type"] == "run_done" and events[-1]["status"] == "succeeded"
    assert len(events[-1]["takes"]) == 1
    assert code == 1000
    assert events == logged(run_id)
    assert status_at_first_progress == "running"


def test_a_client_without_after_gets_everything_past_its_snapshot(farm, owner, personas, db_access):
    from apps.runs.models import RunEvent

    run_id = delay_run(owner, 1.0)
    deadline = time.monotonic() + 30  # once it started, the snapshot already counts some events
    while not RunEvent.objects.filter(run_id=run_id, type="progress").exists():
        assert time.monotonic() < deadline, "the run never reported progress"
        time.sleep(0.05)
    with open_events(farm, run_id, personas["owner"]) as ws:
        messages, code = read_until_closed(ws)

    snapshot, events = messages[0], messages[1:]
    first = snapshot["lastSeq"] + 1
    assert [e["seq"] for e in events] == list(range(first, first + len(events)))
    assert events[-1]["type"] == "run_done" and code == 1000
    assert events == logged(run_id)[snapshot["lastSeq"]:]


def test_a_client_that_reconnects_with_after_misses_nothing_and_sees_nothing_twice(
    farm, owner, personas, db_access
):
    run_id = delay_run(owner, 2.0)
    with open_events(farm, run_id, personas["owner"], after=0) as ws:
        first = [json.loads(ws.recv(timeout=30))]
        while sum(m["type"] == "progress" for m in first) < 5:
            first.append(json.loads(ws.recv(timeout=30)))
    last_seen = first[-1]["seq"]
    from apps.runs.models import Run

    deadline = time.monotonic() + 30  # the run goes on publishing while nobody listens
    while Run.objects.get(pk=run_id).last_seq <= last_seen:
        assert time.monotonic() < deadline, "the run published nothing more"
        time.sleep(0.05)

    with open_events(farm, run_id, personas["owner"], after=last_seen) as ws:
        second, code = read_until_closed(ws)

    assert first[0]["type"] == second[0]["type"] == "snapshot"
    assert second[0]["lastSeq"] > last_seen  # events were published in between
    union = first[1:] + second[1:]
    assert [e["seq"] for e in union] == list(range(1, len(union) + 1))
    assert union == logged(run_id)
    assert union[-1]["type"] == "run_done" and code == 1000


def test_a_finished_run_sends_its_snapshot_and_run_done_then_closes(
    farm, owner, personas, db_access
):
    run_id = delay_run(owner, 0.0)
    run = owner.wait_run(run_id)
    assert run["status"] == "succeeded"
    log = logged(run_id)

    with open_events(farm, run_id, personas["owner"]) as ws:
        messages, code = read_until_closed(ws)
    snapshot, *events = messages
    assert snapshot["run"]["status"] == "succeeded" and len(snapshot["run"]["takes"]) == 1
    assert snapshot["lastSeq"] == log[-1]["seq"]
    assert events == [log[-1]] and events[0]["type"] == "run_done"
    assert code == 1000

    with open_events(farm, run_id, personas["owner"], after=0) as ws:
        messages, code = read_until_closed(ws)
    assert messages[1:] == log and code == 1000

    with open_events(farm, run_id, personas["owner"], after=log[-1]["seq"]) as ws:
        messages, code = read_until_closed(ws)
    assert [m["type"] for m in messages] == ["snapshot"] and code == 1000


def test_the_web_declines_per_message_deflate_though_the_client_offers_it(farm, owner, personas):
    """The web runs as `./farm up` runs it (inline_farm.cli.uvicorn_argv): small JSON frames go
    out uncompressed, with no compressor per socket."""
    run_id = delay_run(owner, 0.0)
    owner.wait_run(run_id)
    with open_events(farm, run_id, personas["owner"]) as ws:
        offered = ws.request.headers.get("Sec-WebSocket-Extensions") if ws.request else None
        assert offered is not None and "permessage-deflate" in offered
        assert ws.response is not None
        assert ws.response.headers.get("Sec-WebSocket-Extensions") is None
        read_until_closed(ws)


def test_refusals_close_with_the_documented_codes(farm, owner, personas):
    run_id = delay_run(owner, 0.0)
    owner.wait_run(run_id)
    url = events_url(farm, run_id)

    assert close_code_of(url) == 4401
    assert close_code_of(url, additional_headers={"Authorization": "Bearer inf_nope"}) == 4401
    assert close_code_of(events_url(farm, run_id, token="inf_nope")) == 4401
    outsider = {"additional_headers": {"Authorization": f"Bearer {personas['outsider']}"}}
    assert close_code_of(url, **outsider) == 4404
    owner_auth = {"additional_headers": {"Authorization": f"Bearer {personas['owner']}"}}
    unknown = "0b5e8d8e-3c3a-4a59-a7c1-6f1b0c2a9e11"
    assert close_code_of(events_url(farm, unknown), **owner_auth) == 4404
    assert close_code_of(events_url(farm, "not-a-uuid"), **owner_auth) == 4404
    assert close_code_of(events_url(farm, run_id, after="-1"), **owner_auth) == 4400


def test_a_teammate_can_follow_my_run(farm, owner, personas):
    run_id = delay_run(owner, 0.0)
    owner.wait_run(run_id)
    with open_events(farm, run_id, personas["teammate"]) as ws:
        messages, code = read_until_closed(ws)
    assert [m["type"] for m in messages] == ["snapshot", "run_done"] and code == 1000


def test_a_token_in_the_query_or_a_subprotocol_authenticates(farm, owner, personas):
    run_id = delay_run(owner, 0.0)
    owner.wait_run(run_id)
    token = personas["owner"]

    with connect(events_url(farm, run_id, token=token), open_timeout=10) as ws:
        messages, code = read_until_closed(ws)
    assert [m["type"] for m in messages] == ["snapshot", "run_done"] and code == 1000

    with connect(events_url(farm, run_id), subprotocols=protocols("inline-farm.v1", f"bearer.{token}"),
                 open_timeout=10) as ws:
        assert ws.subprotocol == "inline-farm.v1"
        messages, code = read_until_closed(ws)
    assert [m["type"] for m in messages] == ["snapshot", "run_done"] and code == 1000

    with connect(events_url(farm, run_id), subprotocols=protocols(f"bearer.{token}"),
                 open_timeout=10) as ws:
        assert ws.subprotocol == f"bearer.{token}"
        messages, code = read_until_closed(ws)
    assert code == 1000

    with connect(events_url(farm, run_id), subprotocols=protocols("inline-farm.v1", "bearer.inf_nope"),
                 open_timeout=10) as ws:
        assert ws.subprotocol == "inline-farm.v1"  # echoed so that browsers see the close code
        assert read_until_closed(ws, timeout=10) == ([], 4401)
