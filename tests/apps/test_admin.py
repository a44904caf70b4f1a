"""The Django admin pages that studio leads and ops use: readable, read-only where the data is,
takes removed only by audited retention, drain / resume the only way to change a worker."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import DatabaseError, transaction
from django.test import RequestFactory
from django.utils import timezone

from apps.fleet.models import Worker, WorkerPool
from apps.graphs.models import Graph
from apps.runs.models import Run, RunEvent
from apps.takes.models import Asset, Take, TakeRemoval
from apps.takes.storage import blob_path, blob_put
from tests.conftest import png

pytestmark = pytest.mark.django_db

# A 1×1 PNG as a data URL, like the worker's progress previews (shorter).
PREVIEW = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
           "+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")


@pytest.fixture
def lead(client):
    user = get_user_model().objects.create_superuser("lead", "lead@studio.test", "pw")
    client.force_login(user)
    return user


def _take(run: Run, node_id: str = "out", data: bytes | None = None, index: int = 0,
          **lineage: object) -> Take:
    data = data or png(8, 8)
    return Take.objects.create(run=run, owner=run.owner, node_id=node_id, index=index,
                               sha256=blob_put(data), media_type="image/png", size=len(data),
                               width=8, height=8,
                               lineage={"prompt": "a fox " * 40, "seed": 7, **lineage})


@pytest.fixture
def graph():
    return Graph.objects.create(sha256="e" * 64, document={"nodes": {
        "out": {"type": "image/save", "params": {}, "inputs": {}}}})


@pytest.fixture
def run_with_take(lead, data_dirs, graph):
    run = Run.objects.create(owner=lead, graph=graph, target="out")
    return run, _take(run)


@pytest.fixture
def worker(db):
    pool = WorkerPool.objects.create(name="local", gpu_type="cpu")
    return Worker.objects.create(
        name="w1@studio", pool=pool, hostname="studio", pid=42, queues=["cpu", "control"],
        node_types=["image/load"], slots=2, running=[], stats={"forwards": 12},
        model_files=[{"folder": "vae", "name": "ae.safetensors", "kind": "file",
                      "size": 3 * 2**20}],
        device={"profile": "cpu"}, last_heartbeat=timezone.now() - timedelta(seconds=2),
    )


def test_every_changelist_renders_and_lists_its_rows(client, lead, run_with_take, worker):
    from apps.accounts.models import ApiToken, Team, UserLimits
    from apps.accounts.services import token_create
    from apps.takes.services import take_remove

    run, take = run_with_take
    asset = Asset.objects.create(owner=lead, sha256=blob_put(png(3, 3)), media_type="image/png",
                                 size=10, original_name="plate.png")
    team = Team.objects.create(name="compositing")
    token = ApiToken.objects.get(pk=token_create(user=lead, name="ci")[0].pk)
    limits = UserLimits.objects.create(user=lead, max_inflight_runs=7)
    gone = _take(run, node_id="old")
    [removal] = take_remove(take_ids=[gone.pk], by=lead, reason="expired")
    rows = {"runs/run": run.pk, "takes/take": take.pk, "takes/asset": asset.pk,
            "takes/takeremoval": removal.pk, "accounts/apitoken": token.pk,
            "accounts/team": team.pk, "accounts/userlimits": limits.pk,
            "fleet/worker": worker.pk, "fleet/workerpool": worker.pool_id,
            "graphs/graph": run.graph_id}
    for model, pk in rows.items():
        page = client.get(f"/admin/{model}/")
        assert page.status_code == 200, model
        body = page.content.decode()
        assert 'id="changelist"' in body, model
        assert f"/admin/{model}/{pk}/change/" in body, model  # the row is listed, linked


def test_read_only_models_offer_no_add_and_no_save(client, run_with_take, worker):
    run, take = run_with_take
    pages = {"runs/run": run.pk, "takes/take": take.pk, "fleet/worker": worker.pk,
             "graphs/graph": run.graph_id}
    for model, pk in pages.items():
        assert client.get(f"/admin/{model}/add/").status_code == 403, model
        page = client.get(f"/admin/{model}/{pk}/change/")
        assert page.status_code == 200, model
        assert 'name="_save"' not in page.content.decode(), model
        assert client.post(f"/admin/{model}/{pk}/change/", {}).status_code == 403, model
    assert 'name="state"' not in client.get(f"/admin/fleet/worker/{worker.pk}/change/")\
        .content.decode()


def test_the_runs_list_shows_short_ids_worker_duration_and_take_count(client, run_with_take):
    run, _ = run_with_take
    Run.objects.filter(pk=run.pk).update(lease_worker="w9@gone")
    page = client.get("/admin/runs/run/").content.decode()
    assert f">{str(run.pk)[:8]}</a>" in page  # the full UUID is only in links and checkboxes
    assert "w9@gone" in page and '<td class="field-take_count">1</td>' in page


def test_a_run_page_shows_its_graph_take_thumbnails_and_worker(client, run_with_take, worker):
    run, take = run_with_take
    Run.objects.filter(pk=run.pk).update(lease_worker=worker.name, attempts=2)
    page = client.get(f"/admin/runs/run/{run.pk}/change/").content.decode()
    assert "image/save" in page
    assert f"/admin/takes/take/{take.pk}/bytes/" in page
    assert f'href="/admin/takes/take/{take.pk}/change/"' in page
    assert f'href="/admin/fleet/worker/{worker.pk}/change/"' in page
    preview = client.get(f"/admin/takes/take/{take.pk}/bytes/")
    assert preview.status_code == 200 and preview["Content-Type"] == "image/png"


def test_a_take_page_shows_its_loras_with_strengths_and_content_hashes(client, run_with_take):
    run, plain = run_with_take
    style, detail = "a" * 64, "b" * 64
    take = _take(run, node_id="styled", data=png(9, 9), loras={
        "loras/style.safetensors": {"sha256": style, "strength": 0.8},
        "loras/detail.safetensors": {"sha256": detail, "strength": -0.25}},
        textEncoderLoras={"loras/style.safetensors": {"sha256": style, "strength": 0.5}})
    page = client.get(f"/admin/takes/take/{take.pk}/change/").content.decode()
    table = page[page.index('<table class="take-loras">'):]
    table = table[:table.index("</table>")]
    assert table.index("loras/detail.safetensors") < table.index("loras/style.safetensors")
    assert ("<td>loras/style.safetensors</td><td>0.8</td><td>0.5</td>"
            f'<td title="{style}"><code>{style[:12]}</code></td>') in table
    assert ("<td>loras/detail.safetensors</td><td>-0.25</td><td>—</td>"
            f'<td title="{detail}"><code>{detail[:12]}</code></td>') in table
    none = client.get(f"/admin/takes/take/{plain.pk}/change/").content.decode()
    assert 'class="take-loras"' not in none and "LoRAs" in none


def _log(run: Run, *events: tuple[str, dict]) -> None:
    start = run.last_seq
    RunEvent.objects.bulk_create(RunEvent(run=run, seq=start + i + 1, type=t, payload=p)
                                 for i, (t, p) in enumerate(events))
    Run.objects.filter(pk=run.pk).update(last_seq=start + len(events))
    run.refresh_from_db()


def test_the_event_log_is_a_paginated_timeline_with_previews_and_errors(client, run_with_take):
    run, take = run_with_take
    _log(run, ("status", {"status": "running", "attempt": 1, "worker": "w1@studio"}))
    _log(run, *[("progress", {"nodeId": "gen", "step": s, "total": 60, "preview": PREVIEW})
                for s in range(1, 61)])
    _log(run, ("node_done", {"nodeId": "out", "nodeType": "image/save", "ms": 12.5,
                             "takes": [{"id": str(take.pk)}]}),
         ("run_done", {"status": "failed", "error": {"code": "node_failed", "nodeId": "gen",
                                                     "message": "zimage/turbo: out of memory"}}))
    page = client.get(f"/admin/runs/run/{run.pk}/change/").content.decode()
    assert "Event log — 63 events" in page and "events 1–50 of 63" in page
    assert page.count('<img class="preview"') == 49 and "1/60" in page
    assert '"preview":' not in page  # no raw payloads

    last = client.get(f"/admin/runs/run/{run.pk}/change/?events_page=2").content.decode()
    assert 'class="ev-run_done failed"' in last and "out of memory" in last
    assert "12.5" in last and f"take {str(take.pk)[:8]}" in last

    milestones = client.get(f"/admin/runs/run/{run.pk}/change/?events=milestones")
    text = milestones.content.decode()
    assert '<img class="preview"' not in text and "node_done" in text and "w1@studio" in text


def test_deleting_a_run_keeps_its_takes(client, run_with_take):
    run, take = run_with_take
    page = client.post(f"/admin/runs/run/{run.pk}/delete/", {"post": "yes"})
    text = page.content.decode()
    assert "Cannot delete run" in text and "protected related objects" in text
    assert f"take {str(take.pk)[:8]}" in text and "retention" in text
    assert Run.objects.filter(pk=run.pk).exists() and Take.objects.filter(pk=take.pk).exists()
    client.post("/admin/runs/run/", {"action": "delete_selected", "_selected_action": [run.pk],
                                     "post": "yes"})
    assert Take.objects.filter(pk=take.pk).exists()


def test_a_run_without_takes_can_be_deleted(client, lead, graph):
    run = Run.objects.create(owner=lead, graph=graph, target="out")
    client.post(f"/admin/runs/run/{run.pk}/delete/", {"post": "yes"})
    assert not Run.objects.filter(pk=run.pk).exists()


def test_takes_cannot_be_deleted_outside_retention(client, run_with_take):
    _, take = run_with_take
    assert client.get(f"/admin/takes/take/{take.pk}/delete/").status_code == 403
    client.post("/admin/takes/take/", {"action": "delete_selected",
                                       "_selected_action": [take.pk], "post": "yes"})
    assert Take.objects.filter(pk=take.pk).exists()
    assert "delete_selected" not in client.get("/admin/takes/take/").content.decode()


def test_retention_removes_a_take_with_an_audit_record_and_its_unreferenced_blob(
    client, lead, run_with_take, django_capture_on_commit_callbacks
):
    run, take = run_with_take
    ask = client.post("/admin/takes/take/", {"action": "remove_for_retention",
                                             "_selected_action": [take.pk]})
    assert ask.status_code == 200 and 'name="reason"' in ask.content.decode()
    assert Take.objects.filter(pk=take.pk).exists()

    with django_capture_on_commit_callbacks(execute=True):
        client.post("/admin/takes/take/", {"action": "remove_for_retention", "confirm": "yes",
                                           "_selected_action": [take.pk],
                                           "reason": "client asked to purge test renders"})
    assert not Take.objects.filter(pk=take.pk).exists()
    removal = TakeRemoval.objects.get(take_id=take.pk)
    assert removal.removed_by == lead and removal.reason == "client asked to purge test renders"
    assert removal.run_id == run.pk and removal.sha256 == take.sha256 and removal.blob_released
    assert removal.lineage["seed"] == 7
    assert not blob_path(take.sha256).exists()
    audit = client.get(f"/admin/takes/takeremoval/{removal.pk}/change/")
    assert audit.status_code == 200
    body = audit.content.decode()
    assert "client asked to purge test renders" in body and take.sha256 in body and "lead" in body


def test_retention_keeps_bytes_another_take_or_an_asset_still_uses(
    client, lead, run_with_take, django_capture_on_commit_callbacks
):
    run, take = run_with_take
    twin = _take(run, node_id="copy")  # same bytes, same sha256
    data = png(9, 9, (1, 2, 3))
    other = _take(run, node_id="other", data=data)
    Asset.objects.create(owner=lead, sha256=other.sha256, media_type="image/png", size=len(data))
    with django_capture_on_commit_callbacks(execute=True):
        client.post("/admin/takes/take/", {"action": "remove_for_retention", "confirm": "yes",
                                           "_selected_action": [take.pk, other.pk],
                                           "reason": "dedupe"})
    assert Take.objects.filter(pk=twin.pk).exists()
    assert not TakeRemoval.objects.filter(blob_released=True).exists()
    assert blob_path(take.sha256).exists() and blob_path(other.sha256).exists()


def test_retention_needs_a_reason(client, run_with_take):
    _, take = run_with_take
    page = client.post("/admin/takes/take/", {"action": "remove_for_retention", "confirm": "yes",
                                              "_selected_action": [take.pk], "reason": "  "})
    assert 'name="reason"' in page.content.decode()
    assert Take.objects.filter(pk=take.pk).exists() and not TakeRemoval.objects.exists()


def test_the_retention_log_is_append_only(lead, run_with_take):
    from apps.takes.services import take_remove

    _, take = run_with_take
    removal = take_remove(take_ids=[take.pk], by=lead, reason="expired")[0]
    with pytest.raises(DatabaseError), transaction.atomic():
        TakeRemoval.objects.filter(pk=removal.pk).update(reason="nothing happened")
    with pytest.raises(DatabaseError), transaction.atomic():
        TakeRemoval.objects.filter(pk=removal.pk).delete()


def test_a_worker_page_shows_slots_runs_models_and_heartbeat_age(client, lead, worker,
                                                                 run_with_take):
    run, _ = run_with_take
    Worker.objects.filter(pk=worker.pk).update(running=[str(run.pk)])
    page = client.get(f"/admin/fleet/worker/{worker.pk}/change/").content.decode()
    assert "1 / 2" in page and f'href="/admin/runs/run/{run.pk}/change/"' in page
    assert "ae.safetensors" in page and "3.0 MiB" in page and " s ago" in page
    assert "&quot;forwards&quot;: 12" in page and 'id="worker-drain"' in page
    listing = client.get("/admin/fleet/worker/").content.decode()
    assert "local" in listing and "cpu, control" in listing


def test_drain_and_resume_buttons_change_a_workers_state(client, lead, worker):
    assert client.get(f"/admin/fleet/worker/{worker.pk}/drain/").status_code == 405
    client.post(f"/admin/fleet/worker/{worker.pk}/drain/")
    worker.refresh_from_db()
    assert worker.state == "draining"
    assert 'id="worker-resume"' in client.get(f"/admin/fleet/worker/{worker.pk}/change/")\
        .content.decode()
    client.post(f"/admin/fleet/worker/{worker.pk}/resume/")
    worker.refresh_from_db()
    assert worker.state == "online"


def test_the_cancel_action_cancels_queued_runs(client, run_with_take):
    run, _ = run_with_take
    client.post("/admin/runs/run/", {"action": "cancel_runs", "_selected_action": [run.pk]})
    run.refresh_from_db()
    assert run.status == "cancelled"


def test_an_admin_crash_is_an_html_page_and_an_api_crash_is_json():
    from inline_farm.urls import handler500

    admin_page = handler500(RequestFactory().get("/admin/runs/run/"))
    assert admin_page.status_code == 500 and admin_page["Content-Type"].startswith("text/html")
    api = handler500(RequestFactory().get("/v1/runs"))
    assert api.status_code == 500 and api["Content-Type"] == "application/json"
    assert b'"code": "internal"' in api.content
