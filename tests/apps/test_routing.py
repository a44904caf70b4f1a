"""VRAM-aware routing: a run goes to the cheapest live queue that fits and holds its files."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from apps.fleet.models import Worker
from apps.fleet.routing import RunCannotFit, need_estimate
from apps.fleet.selectors import queue_for, queue_wait_reasons

pytestmark = pytest.mark.django_db

GB = 10**9
BIG = {"folder": "diffusion_models", "name": "big.safetensors"}
SMALL = {"folder": "diffusion_models", "name": "small.safetensors"}


def _host(name: str, vram: float, queue: str, files: list[tuple[dict, int]], profile: str = "gpu-max",
          state: str = "online") -> Worker:
    return Worker.objects.create(
        name=name, queues=[queue], state=state, last_heartbeat=timezone.now(), slots=2,
        device={"profile": profile, "vram_gb": vram},
        model_files=[{**f, "kind": "file", "size": size} for f, size in files],
    )


def _requirement(model: dict, size_gb: float, pixels: int) -> dict:
    need = need_estimate(model_sizes=[int(size_gb * GB)], pixels=pixels)
    return {"models": [model], "need": need.to_wire()}


def test_the_estimate_is_weights_plus_activations_that_grow_with_the_image():
    small, large = (need_estimate(model_sizes=[12 * GB, 8 * GB], pixels=p)
                    for p in (512 * 512, 2048 * 2048))
    assert small.weights_gb == 20 and small.largest_gb == 12
    assert large.activations_gb > small.activations_gb > 0
    assert large.total_gb == large.weights_gb + large.activations_gb


def test_the_estimate_counts_the_reference_images_an_edit_hands_the_transformer():
    from apps.graphs.schema import GraphDoc
    from apps.runs.services.submit import image_pixels

    def wired(node: str) -> dict[str, str]:
        return {"node": node, "port": "image"}

    nodes: dict[str, Any] = {
        "a": {"type": "image/load", "params": {"asset": "a"}},
        "b": {"type": "image/load", "params": {"asset": "b"}},
        "vae": {"type": "load/vae", "params": {"file": "v.safetensors"}},
        "edit": {"type": "qwenimage/edit", "params": {"megapixels": 0.5},
                 "inputs": {"image": wired("a"), "image_2": wired("b"),
                            "vae": {"node": "vae", "port": "vae"}}},
        "empty": {"type": "latent/empty", "params": {"width": 1024, "height": 512}},
        "klein": {"type": "flux2/reference", "inputs": {"image": wired("a")}},
    }
    graph = GraphDoc.model_validate({"nodes": nodes})
    assert image_pixels(graph, ["a", "b", "vae", "empty"]) == 1024 * 512
    assert image_pixels(graph, list(nodes)) == 1024 * 512 + 2 * 2**19 + 2**20
    del nodes["edit"]["inputs"]["vae"]  # no VAE: the images only inform the prompt
    graph = GraphDoc.model_validate({"nodes": nodes})
    assert image_pixels(graph, list(nodes)) == 1024 * 512 + 2**20
    nodes["kontext"] = {"type": "flux1/reference", "inputs": {"image": wired("b")}}
    graph = GraphDoc.model_validate({"nodes": nodes})  # the largest Kontext resolution
    assert image_pixels(graph, list(nodes)) == 1024 * 512 + 2**20 + 1328 * 800


def test_a_run_goes_to_the_smallest_gpu_class_that_fits_and_holds_its_files():
    _host("l40s@a", 48, "gpu.48g", [(BIG, 20 * GB), (SMALL, 2 * GB)])
    _host("h200@b", 141, "gpu.141g", [(BIG, 20 * GB), (SMALL, 2 * GB)])
    _host("4090@c", 24, "gpu.24g", [(SMALL, 2 * GB)])
    assert queue_for(_requirement(SMALL, 2, 1024 * 1024)) == "gpu.24g"
    assert queue_for(_requirement(BIG, 20, 1024 * 1024)) == "gpu.48g"  # 4090 lacks the file
    assert queue_for(_requirement(BIG, 20, 4096 * 4096)) == "gpu.141g"  # too big for the L40S


def test_a_run_no_live_worker_could_fit_is_refused_with_what_would_fit():
    _host("4090@c", 24, "gpu.24g", [(BIG, 20 * GB)])
    with pytest.raises(RunCannotFit) as refused:
        queue_for(_requirement(BIG, 20, 2048 * 2048))
    message = str(refused.value)
    assert "needs about" in message and "at most 24 GB" in message and "(gpu.40g)" in message


def test_a_lowvram_worker_offloads_so_the_largest_model_must_fit_not_all_of_them():
    _host("3060@d", 12, "gpu.12g", [(BIG, 9 * GB)], profile="lowvram")
    assert queue_for(_requirement(BIG, 9, 512 * 512)) == "gpu.12g"


def test_draining_pools_are_the_last_resort_and_the_wait_reason_says_so():
    _host("l40s@a", 48, "gpu.48g", [(BIG, 20 * GB)], state="draining")
    _host("h200@b", 141, "gpu.141g", [(BIG, 20 * GB)])
    assert queue_for(_requirement(BIG, 20, 1024 * 1024)) == "gpu.141g"
    reasons = queue_wait_reasons({"gpu.48g", "gpu.141g", "gpu.80g"})
    assert "draining" in reasons["gpu.48g"]
    assert "free slot" in reasons["gpu.141g"]
    assert "no live worker serves gpu.80g" in reasons["gpu.80g"]


def test_the_wait_reason_counts_the_busy_slots_of_the_live_online_workers_serving_the_queue():
    busy = _host("a@h", 48, "gpu.48g", [])
    busy.running = ["r1", "r2"]
    busy.save()
    _host("b@h", 48, "gpu.48g", [])  # 2 free slots
    _host("c@h", 48, "gpu.48g", [], state="draining")  # not counted
    lost = _host("d@h", 48, "gpu.48g", [])
    Worker.objects.filter(pk=lost.pk).update(last_heartbeat=timezone.now() - timedelta(hours=1))
    _host("e@h", 48, "gpu.48g", [], state="offline")
    assert queue_wait_reasons({"gpu.48g"}) == {
        "gpu.48g": "waiting for a free slot on gpu.48g (2 of 4 busy)"}


def test_a_poll_of_a_queued_run_reads_why_it_waits_in_its_one_statement():
    """`GET /v1/runs/{id}` of a queued run (Django's view and the run door alike) is one
    statement: the run read carries who serves its queue; the reason is the fleet read's."""
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from apps.graphs.models import Graph
    from apps.runs.models import Run
    from apps.runs.selectors import run_get_for_user, runs_to_wire

    busy = _host("a@h", 48, "gpu.48g", [])
    busy.running = ["r1"]
    busy.save()
    _host("c@h", 48, "gpu.48g", [], state="draining")
    owner = get_user_model().objects.create(username="poller")
    states = [("gpu.48g", "queued"), ("gpu.80g", "queued"), ("gpu.24g", "cancelled")]
    runs = {queue: Run.objects.create(
                owner=owner, graph=Graph.objects.create(sha256=f"{n:064x}", document={}),
                target="out", queue=queue, status=status,
                finished_at=timezone.now() if status == "cancelled" else None)
            for n, (queue, status) in enumerate(states)}
    expected = queue_wait_reasons({"gpu.48g", "gpu.80g"})
    for queue, run in runs.items():
        with CaptureQueriesContext(connection) as queries:
            read = run_get_for_user(user=owner, run_id=run.pk)
            assert read is not None
            wire = runs_to_wire([read])[0]
        assert len(queries) == 1, [q["sql"] for q in queries]
        assert wire["waiting"] == expected.get(queue)
    assert expected["gpu.48g"] == "waiting for a free slot on gpu.48g (1 of 2 busy)"


def test_a_model_graphs_submit_reads_the_fleet_once_and_routes_by_that_read():
    """Validation (the catalog), the memory estimate (the files' sizes) and the route read the
    same live workers: one query of them per submit, whose answers agree."""
    from django.contrib.auth import get_user_model
    from django.db import connection

    from apps.graphs.schema import GraphDoc
    from apps.graphs.validation import GraphInvalid
    from apps.runs.services import run_submit

    stack = [({"folder": "diffusion_models", "name": "m.safetensors"}, 10 * GB),
             ({"folder": "vae", "name": "v.safetensors"}, GB),
             ({"folder": "text_encoders", "name": "t.safetensors"}, 8 * GB)]
    _host("4090@a", 24, "gpu.24g", stack)
    _host("h200@b", 141, "gpu.141g", stack)
    owner = get_user_model().objects.create(username="router")

    def graph(model: str, size: int) -> GraphDoc:
        return GraphDoc.model_validate({"nodes": {
            "gen": {"type": "zimage/turbo", "params": {
                "prompt": "p", "width": size, "height": size, "model": model,
                "vae": "v.safetensors", "text_encoder": "t.safetensors"}},
            "out": {"type": "image/save", "inputs": {"image": {"node": "gen", "port": "image"}}}}})

    sent: list[str] = []  # every statement's text, the prepared ones' too

    def record(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        sent.append(sql)
        return execute(sql, params, many, context)

    for size, queue in ((1024, "gpu.24g"), (4096, "gpu.141g")):
        sent.clear()
        with connection.execute_wrapper(record):
            run, created = run_submit(owner=owner, graph=graph("m.safetensors", size), target="out")
        assert created and run.queue == queue
        reads = [sql for sql in sent if "fleet_worker" in sql]
        assert len(reads) == 1, reads
    with pytest.raises(GraphInvalid) as missing:
        run_submit(owner=owner, graph=graph("other.safetensors", 1024), target="out")
    assert missing.value.code == "model_not_found" and missing.value.node_id == "gen"
