"""Limits that hold under concurrency, and a worker cache that neither leaks across users nor
serves stale weights (issue 9 items 6, 7, 12; issue 15's stale-cache bug)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.conftest import _client, delay_graph, png, smoke_stack_reported, upload
from tests.livefarm import Client

pytestmark = pytest.mark.e2e


def _persona(farm: Any, username: str, **limits: Any) -> Client:
    from apps.accounts.models import UserLimits
    from apps.accounts.services import token_create, user_get_or_create

    user = user_get_or_create(username=username)
    if limits:
        UserLimits.objects.update_or_create(user=user, defaults=limits)
    return _client(farm, token_create(user=user, name="test")[1])


def test_the_in_flight_limit_holds_under_concurrent_submits(farm, db_access):
    from apps.runs.models import Run

    with _persona(farm, "bursty", max_inflight_runs=5) as client:
        asset = upload(client, png(8, 8, (1, 2, 3))).json()["id"]
        graphs = [delay_graph(asset, 20 + i) for i in range(16)]
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda g: client.post("/v1/runs", json=g), graphs))
        codes = sorted(r.status_code for r in answers)
        assert codes == [201] * 5 + [429] * 11, codes
        assert all(r.headers.get("Retry-After") for r in answers if r.status_code == 429)
        assert Run.objects.filter(owner__username="bursty", status__in=["queued", "running"]
                                  ).count() == 5
        for r in answers:
            if r.status_code == 201:
                client.delete(f"/v1/runs/{r.json()['runId']}")


def test_a_user_cannot_raise_priority_past_the_limit_staff_set(farm, db_access):
    with _persona(farm, "eager") as eager, _persona(farm, "trusted", max_priority=10) as trusted:
        asset = upload(eager, png(8, 8, (4, 5, 6))).json()["id"]
        refused = eager.post("/v1/runs", json=delay_graph(asset, 0.1, priority=1))
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "priority_not_allowed"
        assert "priority 1 is above the 0 you may use" in refused.json()["error"]["message"]
        assert eager.post("/v1/runs", json=delay_graph(asset, 0.1, priority=-5)).status_code == 201

        mine = upload(trusted, png(8, 8, (7, 8, 9))).json()["id"]
        assert trusted.post("/v1/runs", json=delay_graph(mine, 0.1, priority=10)).status_code == 201
        assert trusted.post("/v1/runs", json=delay_graph(mine, 0.2, priority=11)).status_code == 403


@pytest.fixture(scope="module")
def cache_stack(farm, data_dirs, personas):
    """A tiny Z-Image stack of its own name (the generation tests keep theirs)."""
    return smoke_stack_reported(farm, personas["owner"], data_dirs["models"], name="cachecheck")


def _graph(stack: dict[str, str], prompt: str) -> dict[str, Any]:
    def wire(node: str, port: str) -> dict[str, str]:
        return {"node": node, "port": port}

    return {"graph": {"nodes": {
        "unet": {"type": "load/diffusion-model", "params": {"file": stack["model"]}},
        "vae": {"type": "load/vae", "params": {"file": stack["vae"]}},
        "te": {"type": "load/text-encoder", "params": {"file": stack["text_encoder"]}},
        "prompt": {"type": "input/text", "params": {"value": prompt}},
        "seed": {"type": "input/int", "params": {"value": 5}},
        "pos": {"type": "encode/text", "inputs": {"encoder": wire("te", "encoder"),
                                                  "text": wire("prompt", "text")}},
        "empty": {"type": "latent/empty", "params": {"width": 32, "height": 32}},
        "sample": {"type": "sample", "params": {"steps": 2},
                   "inputs": {"model": wire("unet", "model"), "positive": wire("pos", "conditioning"),
                              "latent": wire("empty", "latent"), "seed": wire("seed", "value")}},
        "decode": {"type": "vae/decode", "inputs": {"vae": wire("vae", "vae"),
                                                    "latent": wire("sample", "latent")}},
        "out": {"type": "image/save", "inputs": {"image": wire("decode", "image")}},
    }}, "target": "out"}


def _cached_nodes(run_id: str) -> set[str]:
    from apps.runs.models import RunEvent

    done = RunEvent.objects.filter(run_id=run_id, type="node_done").values_list("payload", flat=True)
    return {p["nodeId"] for p in done if p["cached"]}


def test_another_user_never_hits_my_cache(owner, outsider, cache_stack, db_access):
    graph = _graph(cache_stack, "a secret project, shot 42")
    first = owner.wait_run(owner.post("/v1/runs", json=graph).json()["runId"], timeout=120)
    assert first["status"] == "succeeded", first
    theirs = outsider.wait_run(outsider.post("/v1/runs", json=graph).json()["runId"], timeout=120)
    assert theirs["status"] == "succeeded", theirs
    assert _cached_nodes(theirs["id"]) == set()  # computed afresh: no signal that I rendered it

    again = owner.wait_run(owner.post("/v1/runs", json=graph).json()["runId"], timeout=120)
    assert {"pos", "sample", "decode"} <= _cached_nodes(again["id"])  # my own cache still works


def test_new_weights_under_the_same_file_name_are_never_served_from_the_cache(
    owner, cache_stack, data_dirs
):
    from workers.models.zimage.tiny import write_smoke_stack

    graph = _graph(cache_stack, "the same prompt, other weights")
    before = owner.wait_run(owner.post("/v1/runs", json=graph).json()["runId"], timeout=120)
    write_smoke_stack(data_dirs["models"], name="cachecheck", seed=1)  # same names, new bytes
    after = owner.wait_run(owner.post("/v1/runs", json=graph).json()["runId"], timeout=120)
    assert before["status"] == after["status"] == "succeeded", (before, after)
    old, new = before["takes"][0], after["takes"][0]
    model = f"diffusion_models/{cache_stack['model']}"
    assert old["models"][model] != new["models"][model]  # the lineage names the new bytes
    assert old["sha256"] != new["sha256"]  # and the image was rendered with them


def test_a_team_limit_holds_for_all_its_members_with_retry_after(farm, db_access):
    from apps.accounts.models import Team
    from apps.accounts.services import user_get_or_create

    team = Team.objects.create(name="small-team", max_inflight_runs=2)
    team.members.add(user_get_or_create(username="member1"), user_get_or_create(username="member2"))
    with _persona(farm, "member1") as one, _persona(farm, "member2") as two:
        a = upload(one, png(8, 8, (11, 12, 13))).json()["id"]
        b = upload(two, png(8, 8, (14, 15, 16))).json()["id"]
        first = one.post("/v1/runs", json=delay_graph(a, 20))
        second = two.post("/v1/runs", json=delay_graph(b, 20))
        third = two.post("/v1/runs", json=delay_graph(b, 21))
        assert (first.status_code, second.status_code, third.status_code) == (201, 201, 429)
        assert third.headers["Retry-After"] and "team 'small-team'" in third.json()["error"]["message"]
        one.delete(f"/v1/runs/{first.json()['runId']}")
        two.delete(f"/v1/runs/{second.json()['runId']}")
