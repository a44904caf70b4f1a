"""Run events while the channel layer (Redis) is down: the websockets keep serving from the
PostgreSQL log and go back to live events when Redis returns; /v1/health names what is down."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.conftest import delay_graph, png, upload
from tests.events.conftest import EventsFarm
from tests.livefarm import Client

pytestmark = pytest.mark.e2e

OUTAGE_SECONDS = 10.0  # the longest the outage lasts (the run lasts longer)
SERVED_FROM_THE_LOG = 10  # events each socket gets from the log before Redis comes back


class Follower(threading.Thread):
    """One websocket client reading a run's events until the server closes."""

    def __init__(self, farm: EventsFarm, run_id: str, token: str) -> None:
        super().__init__(daemon=True)
        self.url = farm.url.replace("http://", "ws://", 1) + f"/v1/runs/{run_id}/events?after=0"
        self.token = token
        self.messages: list[dict[str, Any]] = []
        self.code: int | None = None
        self.error: BaseException | None = None
        self.opened = threading.Event()

    def run(self) -> None:
        try:
            with connect(self.url, additional_headers={"Authorization": f"Bearer {self.token}"},
                         open_timeout=10) as ws:
                self.opened.set()
                try:
                    while True:
                        self.messages.append(json.loads(ws.recv(timeout=60)))
                except ConnectionClosed as closed:
                    # rcvd is None when the server vanished without a close frame: 1006.
                    self.code = closed.rcvd.code if closed.rcvd else 1006
        except BaseException as exc:  # noqa: BLE001 — reported by the test
            self.error = exc
            self.opened.set()

    def events(self) -> list[dict[str, Any]]:
        return self.messages[1:]


def start_run(client: Client, seconds: float, color: int) -> str:
    asset = upload(client, png(8, 8, (color, 21, 99))).json()
    submitted = client.post("/v1/runs", json=delay_graph(asset["id"], seconds))
    assert submitted.status_code == 201, submitted.text
    return str(submitted.json()["runId"])


def start_run_here(farm: EventsFarm, client: Client, seconds: float, color: int) -> str:
    """`start_run`, running on this farm's worker. The session farm's dispatcher passes over the
    same database and queue (`cpu`, every INLINE_REAPER_INTERVAL): in the moment between a
    submit's commit and this web's own pass, it may publish the run to the session's broker,
    and the session's worker runs it, its events on the session's channel layer. Such a run is
    cancelled and another submitted."""
    from apps.runs.models import Run

    for attempt in range(5):
        run_id = start_run(client, seconds + attempt / 1000, color)  # never coalesced
        run = Run.objects.filter(pk=run_id)
        wait_for(lambda run=run: run.get().status != "queued", 30, "the run to start")
        if run.get().lease_worker.startswith(farm.worker_name):
            return run_id
        client.delete(f"/v1/runs/{run_id}")
    raise AssertionError("the session farm took every run submitted here")


def logged(run_id: str) -> list[dict[str, Any]]:
    from apps.runs.events import event_to_wire
    from apps.runs.models import RunEvent

    return [event_to_wire(e) for e in RunEvent.objects.filter(run_id=run_id).order_by("seq")]


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_followers_keep_every_event_through_a_redis_outage(
    events_farm, events_owner, personas, db_access
):
    from apps.runs.models import Run

    run_id = start_run_here(events_farm, events_owner, OUTAGE_SECONDS + 6, color=1)
    followers = [Follower(events_farm, run_id, personas["owner"]) for _ in range(4)]
    for follower in followers:
        follower.start()
        follower.opened.wait(15)
    wait_for(lambda: all(sum(m["type"] == "progress" for m in f.messages) >= 5
                         for f in followers), 30, "live progress before the outage")
    assert Run.objects.get(pk=run_id).lease_worker.startswith(events_farm.worker_name)

    events_farm.channel_redis.stop()
    try:
        heard = [len(f.messages) for f in followers]
        # Still served meanwhile, from the log: a second's worth of progress or more (the run
        # writes ~10 events a second) reaches every socket while Redis stays down.
        wait_for(lambda: all(len(f.messages) >= n + SERVED_FROM_THE_LOG
                             for f, n in zip(followers, heard, strict=True)),
                 OUTAGE_SECONDS, "every socket served from the log during the outage")
        assert all(f.code is None for f in followers)
    finally:
        events_farm.channel_redis.start()

    for follower in followers:
        follower.join(timeout=60)
    log = logged(run_id)
    assert log[-1]["type"] == "run_done" and log[-1]["status"] == "succeeded"
    for follower in followers:
        assert follower.error is None, follower.error
        assert follower.code == 1000  # never 1006
        events = follower.events()
        assert [e["seq"] for e in events] == list(range(1, len(log) + 1))
        assert events == log
    web_log = (events_farm.web.logs / "web.log").read_text()
    assert "channel layer unavailable" in web_log and "channel layer back" in web_log


def test_a_socket_opened_while_redis_is_down_is_served_from_the_log(
    events_farm, events_owner, personas, db_access
):
    run_id = start_run(events_owner, 3.0, color=2)
    events_farm.channel_redis.stop()
    try:
        follower = Follower(events_farm, run_id, personas["owner"])
        follower.start()
        follower.join(timeout=60)
    finally:
        events_farm.channel_redis.start()
    assert follower.error is None, follower.error
    assert follower.code == 1000
    assert follower.events() == logged(run_id)


def test_health_names_the_channel_layer_while_it_is_down(events_farm):
    def health() -> httpx.Response:
        return httpx.get(f"{events_farm.url}/v1/health", timeout=10)

    up = health()
    assert up.status_code == 200
    assert up.json() == {**up.json(), "status": "ok", "database": "ok", "broker": "ok",
                         "channelLayer": "ok", "down": []}
    assert up.json()["workers"] >= 1

    events_farm.channel_redis.stop()
    try:
        wait_for(lambda: health().status_code == 503, 10, "health to notice")
        down = health().json()
        assert down["status"] == "degraded" and down["down"] == ["channelLayer"]
        assert down["channelLayer"].startswith("error") and down["database"] == "ok"
    finally:
        events_farm.channel_redis.start()
    wait_for(lambda: health().status_code == 200, 10, "health to recover")


def test_a_socket_closes_with_1011_when_redis_and_postgres_are_both_down(
    events_farm, events_owner, personas, db_access
):
    run_id = start_run(events_owner, 8.0, color=3)
    follower = Follower(events_farm, run_id, personas["owner"])
    follower.start()
    wait_for(lambda: len(follower.messages) >= 3, 30, "the first events")

    events_farm.database.cut()
    events_farm.channel_redis.stop()
    try:
        # Reads wait for the connection pool's timeout (20 s) before they fail.
        follower.join(timeout=60)
        assert not follower.is_alive()
        assert follower.error is None, follower.error
        assert follower.code == 1011
    finally:
        events_farm.channel_redis.start()
        events_farm.database.restore()
    events_owner.wait_run(run_id)  # the run itself never depended on the web process
