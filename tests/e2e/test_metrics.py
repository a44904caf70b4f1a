"""`GET /metrics` during a small load run: staff (or an allowed network) only, the text parses
with Prometheus' own parser, and the farm's numbers move with the load."""

from __future__ import annotations

import ipaddress
from collections import defaultdict
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import _client, delay_graph, png, smoke_stack_reported, upload
from tests.e2e.recovery_helpers import wait_until

pytestmark = pytest.mark.e2e

W, H, STEPS = 64, 48, 4


@pytest.fixture(scope="module")
def stack(farm, data_dirs, personas):
    """A tiny Z-Image stack of its own name, once a heartbeat reported it."""
    return smoke_stack_reported(farm, personas["owner"], data_dirs["models"], name="metricscheck")


@pytest.fixture
def staff(farm, personas):
    with _client(farm, personas["staff"]) as client:
        yield client


def turbo(stack: dict[str, str], seed: int) -> dict[str, Any]:
    node = {"type": "zimage/turbo", "params": {
        "prompt": "a red barn", "width": W, "height": H, "steps": STEPS, "seed": seed,
        "model": stack["model"], "vae": stack["vae"], "text_encoder": stack["text_encoder"]}}
    return {"graph": {"nodes": {"gen": node, "out": {
        "type": "image/save", "inputs": {"image": {"node": "gen", "port": "image"}}}}},
        "target": "out"}


class Scrape:
    """One parsed exposition: value(name, **labels) sums the samples whose labels match."""

    def __init__(self, text: str) -> None:
        self.types: dict[str, str] = {}
        self.samples: list[tuple[str, dict[str, str], float]] = []
        for family in text_string_to_metric_families(text):
            self.types[family.name] = family.type
            self.samples += [(s.name, s.labels, s.value) for s in family.samples]

    def value(self, name: str, **labels: str) -> float:
        return sum(v for n, found, v in self.samples
                   if n == name and all(found.get(k) == want for k, want in labels.items()))


def scrape(client) -> Scrape:
    response = client.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return Scrape(response.text)


def test_only_staff_read_the_metrics(anonymous, owner, staff):
    assert anonymous.get("/metrics").status_code == 401
    refused = owner.get("/metrics")
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "forbidden"
    assert staff.get("/metrics").status_code == 200


@pytest.mark.django_db
def test_an_allowed_network_scrapes_without_a_token(client, settings):
    settings.INLINE_METRICS_ALLOW = [ipaddress.ip_network("10.1.0.0/16")]
    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="10.2.0.1").status_code == 401


def test_a_scrape_during_a_load_run_shows_the_farm_moving(owner, staff, stack):
    before = scrape(staff)
    assert before.types["inline_dispatch_latency_seconds"] == "histogram"  # a gauge histogram
    asset = upload(owner, png(12, 12, (40, 50, 60))).json()["id"]
    # More delay runs than the worker's 4 slots, so some wait; tiny renders for steps and batches.
    run_ids = [owner.post("/v1/runs", json=delay_graph(asset, 1.0 + i / 1000)).json()["runId"]
               for i in range(8)]
    run_ids += [owner.post("/v1/runs", json=turbo(stack, seed)).json()["runId"]
                for seed in range(4)]

    peak: dict[str, float] = defaultdict(float)

    def load_done() -> bool:  # each poll also records the peaks a scrape shows meanwhile
        now = scrape(staff)
        for key, value in {"depth": now.value("inline_queue_depth", queue="cpu"),
                           "oldest": now.value("inline_queue_oldest_seconds", queue="cpu"),
                           "running": now.value("inline_runs", status="running"),
                           "busy": now.value("inline_worker_busy_slots")}.items():
            peak[key] = max(peak[key], value)
        return all(owner.get(f"/v1/runs/{r}").json()["status"] not in ("queued", "running")
                   for r in run_ids)

    wait_until("the load run finishing", load_done, 120, every=0.3)
    assert all(owner.get(f"/v1/runs/{r}").json()["status"] == "succeeded" for r in run_ids)

    def heartbeat_after_the_load() -> Scrape | None:
        # The workers' own counters (busy slots, batch sizes) come with their heartbeats: wait
        # for one that has seen the renders' forwards and no run left in a slot.
        now = scrape(staff)
        done = (now.value("inline_worker_busy_slots") == 0
                and now.value("inline_batch_size_count") > before.value("inline_batch_size_count"))
        return now if done else None

    after = wait_until("a heartbeat after the load", heartbeat_after_the_load, 30, every=0.2)

    assert peak["depth"] > 0 and peak["oldest"] > 0 and peak["running"] > 0, peak
    assert peak["busy"] > 0, peak
    assert after.value("inline_queue_depth", queue="cpu") == 0
    assert after.value("inline_worker_busy_slots") == 0
    assert (after.value("inline_runs", status="succeeded", queue="cpu")
            >= before.value("inline_runs", status="succeeded", queue="cpu") + len(run_ids))
    # Rolling windows (the last RECENT_SECONDS): earlier tests' runs may leave them meanwhile, so
    # the count need not grow; this load's runs, claimed and finished within it, are all in.
    for name in ("inline_dispatch_latency_seconds_gcount", "inline_run_duration_seconds_gcount"):
        assert after.value(name) >= len(run_ids), name
    assert after.value("inline_run_duration_seconds_gsum", status="succeeded") > 0
    assert (after.value("inline_step_seconds_gcount", node_type="zimage/turbo")
            > before.value("inline_step_seconds_gcount", node_type="zimage/turbo"))
    assert after.value("inline_step_seconds_gsum", node_type="zimage/turbo") > 0
    assert after.value("inline_run_events_total") > before.value("inline_run_events_total")
    assert after.value("inline_workers", state="online") >= 1
    assert after.value("inline_worker_slots") >= 4
    assert after.value("inline_queue_workers", queue="cpu") >= 1
    # Every forward's batch, as the worker counted it: the renders' forwards are in.
    assert after.value("inline_batch_size_count") > before.value("inline_batch_size_count")
    assert "inline_batch_size" in after.types
