"""The admin as a studio lead and an operator use it, in headless Chromium at 1400 px, on a live
farm with real runs and takes: every page fits the window, thumbnails load, drain and resume work.

Screenshots of each page are saved in test-output/admin-browser/ (see conftest.SCREENSHOTS).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.browser.conftest import SCREENSHOTS, WINDOW
from tests.conftest import png, resize_graph, smoke_stack_reported, upload

pytestmark = pytest.mark.e2e


def look(page: Any, name: str) -> None:
    """Every image on `page` loaded, nothing wider than the window; save `name`.png."""
    page.wait_for_load_state("load")
    page.wait_for_function("Array.from(document.images).every(i => i.complete)")
    broken = page.evaluate(
        "Array.from(document.images).filter(i => !(i.naturalWidth > 0)).map(i => i.src)"
    )
    assert not broken, f"{name}: images that did not load: {[b[:100] for b in broken]}"
    width, window = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    # A changelist scrolls its table inside .results: columns there can hide off-screen too.
    clipped = page.evaluate(
        "Array.from(document.querySelectorAll('.results, #content, #content-main'))"
        ".filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.className || e.id)"
    )
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)
    assert width <= window, f"{name} is {width} px wide in a {window} px window"
    assert not clipped, f"{name}: {clipped} scroll sideways (columns hidden off-screen)"


def submit(client: Any, body: dict[str, Any]) -> str:
    answer = client.post("/v1/runs", json=body)
    assert answer.status_code in (200, 201), answer.text
    return str(answer.json()["runId"])


def on_screen(page: Any, selector: str) -> bool:
    box = page.locator(selector).first.bounding_box()
    return box is not None and box["x"] + box["width"] <= WINDOW["width"]


@pytest.fixture(scope="module")
def stack(farm: Any, data_dirs: Any, personas: Any) -> dict[str, str]:
    """The tiny random Z-Image stack in the worker's models dir, once a heartbeat reports it."""
    return smoke_stack_reported(farm, personas["owner"], data_dirs["models"])


@pytest.fixture(scope="module")
def renders(farm: Any, personas: Any, stack: dict[str, str]) -> dict[str, Any]:
    """Real runs with takes: three image resizes and one Z-Image render (progress previews)."""
    from tests.conftest import _client

    with _client(farm, personas["owner"]) as owner:
        asset = upload(owner, png(96, 64, (40, 120, 200))).json()
        runs = [submit(owner, resize_graph(asset["id"], w, h))
                for w, h in ((64, 48), (48, 48), (120, 40))]
        turbo = {"graph": {"nodes": {
            "gen": {"type": "zimage/turbo", "params": {
                "prompt": "a lighthouse at dusk, oil painting " * 8, "width": 64, "height": 48,
                "steps": 4, "seed": 5, "model": stack["model"], "vae": stack["vae"],
                "text_encoder": stack["text_encoder"]}},
            "out": {"type": "image/save", "inputs": {"image": {"node": "gen", "port": "image"}}},
        }}, "target": "out"}
        turbo_id = submit(owner, turbo)
        finished = [owner.wait_run(r, timeout=120) for r in [*runs, turbo_id]]
    assert all(r["status"] == "succeeded" for r in finished), finished
    return {"runs": runs, "turbo": turbo_id, "takes": [t["id"] for r in finished
                                                       for t in r["takes"]]}


def test_the_runs_list_fits_the_window_with_every_column(admin, farm, renders):
    admin.goto(f"{farm.url}/admin/runs/run/")
    look(admin, "runs-list")
    for run_id in [*renders["runs"], renders["turbo"]]:
        assert admin.locator(f"th.field-run_id a:text-is('{run_id[:8]}')").count() == 1
    for column in ("owner", "status_badge", "queue", "worker", "run_duration", "take_count",
                   "created"):
        assert on_screen(admin, f"th.column-{column}"), column
    admin.set_viewport_size({"width": 1280, "height": WINDOW["height"]})  # a laptop screen
    try:
        look(admin, "runs-list-1280")
    finally:
        admin.set_viewport_size(WINDOW)


def test_a_run_page_shows_takes_and_a_timeline_with_previews(admin, farm, renders):
    admin.goto(f"{farm.url}/admin/runs/run/{renders['turbo']}/change/")
    look(admin, "run-page")
    assert admin.locator("img.take-thumb").count() == 1
    assert admin.locator("table.timeline tr.ev-progress img.preview").count() >= 1
    assert admin.locator("table.timeline tr.ev-run_done").count() == 1
    assert admin.locator("input[name=_save]").count() == 0

    admin.click("img.take-thumb")  # a take thumbnail leads to the take's page
    admin.wait_for_url("**/admin/takes/take/*/change/")
    look(admin, "take-page")
    assert "graphSha256" in admin.inner_text("fieldset:has-text('Lineage')")
    assert admin.locator("input[name=_save], a.deletelink").count() == 0


def test_the_takes_list_shows_thumbnails_and_fits_the_window(admin, farm, renders):
    admin.goto(f"{farm.url}/admin/takes/take/")
    look(admin, "takes-list")
    assert admin.locator("img.take-thumb").count() >= len(renders["takes"])
    for column in ("run_link", "node_id", "dims", "seed", "created"):
        assert on_screen(admin, f"th.column-{column}"), column
    options = admin.locator("select[name=action] option").all_inner_texts()
    assert any("retention" in o for o in options) and not any("Delete" in o for o in options)


def test_ops_drain_and_resume_a_worker_from_its_page(admin, farm, renders, personas, db_access):
    from apps.fleet.selectors import workers_live
    from apps.fleet.services import worker_drain, worker_resume
    from tests.conftest import _client

    admin.goto(f"{farm.url}/admin/fleet/worker/")
    look(admin, "workers-list")
    live = list(workers_live().order_by("-last_heartbeat"))
    worker, others = live[0], live[1:]
    admin.goto(f"{farm.url}/admin/fleet/worker/{worker.pk}/change/")
    look(admin, "worker-page")
    text = admin.inner_text("#content").lower()
    for label in ("slots in use", "current runs", "models held", "heartbeat", " ago"):
        assert label in text, label
    assert admin.locator("input[name=_save], select[name=state]").count() == 0

    try:
        admin.click("#worker-drain")
        admin.wait_for_selector("#worker-resume")
        worker.refresh_from_db()
        assert worker.state == "draining"
        for other in others:  # so that no worker takes the run below
            worker_drain(worker=other)
        time.sleep(1.0)  # the cancel_consumer broadcast reaches the worker between tasks
        with _client(farm, personas["owner"]) as owner:
            asset = upload(owner, png(16, 16, (9, 9, 200))).json()
            run_id = submit(owner, resize_graph(asset["id"], 8, 8))
            time.sleep(2.0)
            assert owner.get(f"/v1/runs/{run_id}").json()["status"] == "queued"
            look(admin, "worker-page-draining")

            admin.click("#worker-resume")
            admin.wait_for_selector("#worker-drain")
            for other in others:
                worker_resume(worker=other)
            assert owner.wait_run(run_id, timeout=60)["status"] == "succeeded"
        worker.refresh_from_db()
        assert worker.state == "online"
    finally:  # never leave the session's farm drained for the tests after us
        for w in live:
            w.refresh_from_db()
            worker_resume(worker=w)


def test_a_run_with_takes_cannot_be_deleted_and_a_take_goes_only_through_retention(
    admin, farm, renders, db_access
):
    from apps.takes.models import Take, TakeRemoval
    from apps.takes.storage import blob_path

    run_id = renders["runs"][2]  # the 120×40 resize: bytes no other take shares
    take = Take.objects.get(run_id=run_id)
    admin.goto(f"{farm.url}/admin/runs/run/{run_id}/delete/")
    look(admin, "run-delete-refused")
    assert "Cannot delete run" in admin.inner_text("#content")
    assert admin.locator("input[type=submit]").count() == 0

    admin.goto(f"{farm.url}/admin/takes/take/")
    admin.check(f"input[name=_selected_action][value='{take.pk}']")
    admin.select_option("select[name=action]", "remove_for_retention")
    admin.click("button[name=index]")
    admin.wait_for_selector("textarea[name=reason]")
    look(admin, "retention-confirm")
    admin.fill("textarea[name=reason]", "test render, the client never saw it")
    admin.click("input[value='Remove these takes']")
    admin.wait_for_selector("ul.messagelist li.success")

    assert not Take.objects.filter(pk=take.pk).exists()
    removal = TakeRemoval.objects.get(take_id=take.pk)
    assert removal.removed_by.username == "browser-lead" and removal.blob_released
    assert not blob_path(take.sha256).exists()
    admin.goto(f"{farm.url}/admin/takes/takeremoval/")
    look(admin, "take-removals")
    assert "test render, the client never saw it" in admin.inner_text("#result_list")
