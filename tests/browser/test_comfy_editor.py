"""ComfyUI's own editor on the live farm, in headless Chromium: two artists log in, one renders a
Z-Image workflow and saves it, the other sees none of it, the farm restarts and the history is
still there; a node the farm lacks is named when queued; /object_info passes the editor's own
node-definition schema (the zod schema in the frontend package's bundle).

Screenshots land in test-output/comfy-editor/ (INLINE_TEST_OUTPUT moves it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS, WINDOW
from tests.conftest import smoke_stack_reported
from tests.livefarm import REPO

pytestmark = pytest.mark.e2e

SCREENSHOTS = Path(os.environ.get("INLINE_TEST_OUTPUT", REPO / "test-output")) / "comfy-editor"
WORKFLOW = REPO / "tests/apps/importer/workflows/z_image_turbo.api.json"
ARTISTS = {"artist-a": "a-long-test-password-a", "artist-b": "a-long-test-password-b"}


@pytest.fixture(scope="module")
def artists(django_db_blocker: Any) -> dict[str, str]:
    """Two artists with passwords, in no team together."""
    from apps.accounts.services import user_get_or_create

    with django_db_blocker.unblock():
        for name, password in ARTISTS.items():
            user = user_get_or_create(username=name)
            user.set_password(password)
            user.save(update_fields=["password"])
    return ARTISTS


@pytest.fixture(scope="module")
def stack(farm: Any, data_dirs: Any, personas: Any) -> dict[str, str]:
    return smoke_stack_reported(farm, personas["owner"], data_dirs["models"])


@pytest.fixture(scope="module")
def browser(monkeypatch_module: pytest.MonkeyPatch) -> Iterator[Any]:
    """Chromium with a fresh context per artist (each its own cookies and local storage)."""
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"no Chromium at {CHROMIUM} (apt-get install -y chromium)", pytrace=False)
    from playwright.sync_api import sync_playwright

    monkeypatch_module.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "1")  # see conftest.chromium_context
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()
            from django.db import connections

            connections.close_all()


class Editor:
    """One artist's editor tab, with what the page asked of the farm and heard on its socket."""

    def __init__(self, browser: Any, farm: Any, name: str, password: str) -> None:
        self.farm, self.name = farm, name
        self.context = browser.new_context(viewport=WINDOW)
        self.page = self.context.new_page()
        self.failures: list[str] = []  # requests the farm answered with a 5xx
        self.frames: list[dict[str, Any]] = []
        self.page.on("response", self._response)
        self.page.on("websocket", self._socket)
        self.page.goto(f"{farm.url}/comfy/")
        self.page.wait_for_url("**/login/?next=/comfy/")
        self.page.fill("#id_username", name)
        self.page.fill("#id_password", password)
        self.page.click("input[type=submit]")
        self.page.wait_for_url(f"{farm.url}/comfy/")
        self.wait_ready()

    def _response(self, response: Any) -> None:
        if response.status >= 500:
            self.failures.append(f"{response.status} {response.url}")

    def _socket(self, ws: Any) -> None:
        def heard(payload: Any) -> None:
            if isinstance(payload, str):
                self.frames.append(json.loads(payload))

        ws.on("framereceived", heard)

    def wait_ready(self) -> None:
        self.page.wait_for_function(
            "window.app && window.app.graph && window.app.canvas"
            " && !document.getElementById('splash-loader')", timeout=45_000)

    def api(self, route: str, method: str = "GET", body: Any = None) -> Any:
        """A call through the editor's own API client (its base URL, its session)."""
        return self.page.evaluate(
            """async ([route, method, body]) => {
                const r = await window.app.api.fetchApi(route, body === null ? {method} :
                    {method, body: JSON.stringify(body)});
                const text = await r.text();
                let data = null; try { data = JSON.parse(text) } catch (e) {}
                return {status: r.status, data};
            }""", [route, method, body])

    def wait_frame(self, kind: str, timeout: float = 90) -> dict[str, Any]:
        """The first socket message of `kind`, once the page heard it."""
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = next((f for f in self.frames if f.get("type") == kind), None)
            if found is not None:
                return found
            self.page.wait_for_timeout(200)
        raise AssertionError(f"no {kind} message; heard {[f.get('type') for f in self.frames]}")

    def close_dialogs(self) -> list[str]:
        """Dismiss what the editor opened by itself (the templates browser on a first visit,
        a missing-models warning); returns their texts."""
        texts = []
        for _ in range(5):
            dialogs = self.page.locator("[role=dialog]")
            if dialogs.count() == 0:
                break
            texts.append(dialogs.first.inner_text()[:300])
            self.page.keyboard.press("Escape")
            self.page.wait_for_timeout(300)
        return texts

    def open_queue(self) -> None:
        """The queue panel open (its toggle keeps its state across reloads)."""
        heading = self.page.locator("[data-testid=queue-progress-overlay] >> text=Job Queue")
        if not heading.is_visible():
            self.page.click("[data-testid=queue-overlay-toggle]")
        heading.wait_for(state="visible", timeout=10_000)

    def shot(self, name: str) -> None:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(SCREENSHOTS / f"{name}.png"))


def zimage_prompt(stack: dict[str, str]) -> dict[str, Any]:
    """ComfyUI's Z-Image Turbo workflow (API format) on the tiny stack, small and quick."""
    prompt = json.loads(WORKFLOW.read_text())
    by_type = {node["class_type"]: node["inputs"] for node in prompt.values()}
    by_type["UNETLoader"]["unet_name"] = stack["model"]
    by_type["CLIPLoader"]["clip_name"] = stack["text_encoder"]
    by_type["VAELoader"]["vae_name"] = stack["vae"]
    by_type["EmptySD3LatentImage"].update(width=64, height=48)
    by_type["KSampler"].update(steps=4, seed=7)
    return prompt


@pytest.fixture(scope="module")
def editors(
    browser: Any, farm: Any, artists: dict[str, str], stack: dict[str, str]
) -> Iterator[dict[str, Editor]]:
    """Both artists logged in, once the worker holds the tiny Z-Image stack (the editor reads
    the model lists of /object_info as it opens)."""
    opened = {name: Editor(browser, farm, name, password) for name, password in artists.items()}
    yield opened
    for editor in opened.values():
        editor.context.close()


def test_an_artist_renders_zimage_in_the_editor_and_another_sees_none_of_it(
    editors: dict[str, Editor], stack: dict[str, str], farm: Any
) -> None:
    a, b = editors["artist-a"], editors["artist-b"]
    page = a.page
    page.evaluate("([p]) => window.app.loadApiJson(p, 'fox.json')", [zimage_prompt(stack)])
    page.wait_for_function("window.app.graph.nodes.length >= 9")
    saved = a.api("/userdata/workflows%2Ffox.json?overwrite=true&full_info=true", "POST",
                  page.evaluate("window.app.graph.serialize()"))
    assert saved["status"] == 200 and saved["data"]["path"] == "workflows/fox.json", saved

    # A first visit opens the templates browser: workflows that import here.
    # ComfyUI's own shipped workflows that import here, most used first, then the farm's own.
    page.wait_for_selector("[role=dialog] >> text=Qwen Image 2.1: Text to Image", timeout=15_000)
    a.shot("templates-browser")
    page.click("[role=dialog] >> text=Inline Farm")
    page.wait_for_selector("[role=dialog] >> text=Z-Image Turbo", timeout=15_000)
    a.close_dialogs()
    with page.expect_response(lambda r: r.url.endswith("/api/prompt")
                              and r.request.method == "POST") as queued:
        page.click("[data-testid=queue-button]")
    assert queued.value.status == 200, queued.value.text()
    a.wait_frame("execution_success")
    kinds = [frame.get("type") for frame in a.frames]
    for kind in ("status", "execution_start", "progress", "executed", "execution_success"):
        assert kind in kinds, (kind, kinds)
    page.set_viewport_size({"width": 2000, "height": 1000})  # the whole workflow, readable
    page.keyboard.press(".")  # fit the whole workflow in view (the canvas draws the output)
    page.wait_for_function(
        "window.app.graph.nodes.some(n => n.imgs && n.imgs.length && n.imgs[0].naturalWidth > 0)",
        timeout=30_000)
    a.shot("editor-finished-render")
    page.set_viewport_size(WINDOW)

    jobs = a.api("/jobs?status=completed,failed,cancelled&limit=10&offset=0")["data"]["jobs"]
    assert [j["status"] for j in jobs] == ["completed"], jobs
    assert jobs[0]["preview_output"]["filename"].endswith(".png")
    image = page.evaluate("window.app.graph.nodes.find(n => n.imgs && n.imgs.length).imgs[0].src")
    assert "/comfy/api/view?filename=" in image and jobs[0]["preview_output"]["filename"] in image

    page.click("[data-testid=queue-overlay-toggle]")
    page.wait_for_timeout(500)
    a.shot("queue-panel")
    # The history links to the run's takes: the output's url opens the take in this session.
    link = jobs[0]["preview_output"]["url"]
    assert link == jobs[0]["farm"]["takes"][0]["url"] and link.startswith("/comfy/api/view?")
    opened = page.evaluate("async (u) => { const r = await fetch(u);"
                           " return [r.status, r.headers.get('content-type')] }", link)
    assert opened == [200, "image/png"], opened
    # The queue panel's entry for the job shows the take through that link (resultItemUrl).
    page.locator(f"img[src^='{link}']").first.wait_for(timeout=30_000)  # the panel refreshes on its own poll

    # The other artist: no jobs, no workflows, and A's run is a stranger's to B.
    b_jobs = b.api("/jobs?status=completed,failed,cancelled,pending,in_progress&limit=50&offset=0")
    assert b_jobs["data"]["jobs"] == []
    assert b.api("/userdata?dir=workflows&recurse=true&split=false&full_info=true")["status"] == 404
    assert b.api(f"/jobs/{jobs[0]['id']}")["status"] == 404
    assert b.api("/userdata/workflows%2Ffox.json")["status"] == 404
    assert a.failures == [] and b.failures == []


def test_history_and_workflows_survive_a_farm_restart(editors: dict[str, Editor], farm: Any) -> None:
    a = editors["artist-a"]
    farm.stop("web")
    farm.stop("worker")
    farm.start_web()
    farm.start_worker()
    a.page.reload()
    a.wait_ready()
    jobs = a.api("/jobs?status=completed,failed,cancelled&limit=10&offset=0")["data"]["jobs"]
    assert [j["status"] for j in jobs] == ["completed"]
    # The admin's "open in the editor" link: the run's own workflow opens in a new tab.
    a.page.goto(f"{farm.url}/comfy/?template={jobs[0]['id']}&source=farm-runs")
    a.wait_ready()
    a.page.wait_for_function("window.app.graph.nodes.some(n => n.type === 'KSampler')"
                             " && window.app.graph.nodes.length >= 9", timeout=20_000)
    listed = a.api("/userdata?dir=workflows&recurse=true&split=false&full_info=true")["data"]
    assert [f["path"] for f in listed] == ["fox.json"]
    detail = a.api(f"/jobs/{jobs[0]['id']}")["data"]
    assert detail["workflow"]["extra_data"]["extra_pnginfo"]["workflow"]["nodes"]
    assert a.failures == []


def test_a_deleted_history_entry_stays_deleted_after_a_reload(editors: dict[str, Editor]) -> None:
    """The editor's own Delete (its API client's `deleteItem('history', id)`, what the queue
    panel's and the history sidebar's delete call): another artist's delete of the id changes
    nothing; the owner's sticks across a reload, and the queue panel no longer shows the take."""
    a, b = editors["artist-a"], editors["artist-b"]
    query = "/jobs?status=completed,failed,cancelled&limit=10&offset=0"
    jobs = a.api(query)["data"]["jobs"]
    assert [j["status"] for j in jobs] == ["completed"], jobs
    job, filename = jobs[0]["id"], jobs[0]["preview_output"]["filename"]

    a.close_dialogs()
    a.open_queue()
    # The panel shows the take by its name (the URL it builds orders the query its own way).
    shown = f"[data-testid=queue-progress-overlay] img[src*='filename={filename}']"
    a.page.locator(shown).first.wait_for(timeout=10_000)  # listed before the delete

    b.page.evaluate("(id) => window.app.api.deleteItem('history', id)", job)
    assert [j["id"] for j in a.api(query)["data"]["jobs"]] == [job]

    a.page.evaluate("(id) => window.app.api.deleteItem('history', id)", job)
    a.page.reload()
    a.wait_ready()
    a.close_dialogs()
    assert a.api(query)["data"]["jobs"] == []
    assert a.api("/history?max_items=64")["data"] == {}
    assert a.api(f"/history/{job}")["data"] == {}
    a.open_queue()
    a.page.wait_for_timeout(1000)
    assert a.page.locator(shown).count() == 0
    a.shot("queue-panel-after-delete")
    assert a.failures == [] and b.failures == []


def test_a_node_the_farm_lacks_is_named_when_queued(
    editors: dict[str, Editor], stack: dict[str, str]
) -> None:
    a = editors["artist-a"]
    page = a.page
    a.close_dialogs()
    page.evaluate("([p]) => window.app.loadApiJson(p, 'fox.json')", [zimage_prompt(stack)])
    page.wait_for_function("window.app.graph.nodes.length >= 9")
    workflow = page.evaluate("window.app.graph.serialize()")
    template = next(n for n in workflow["nodes"] if n["type"] == "SaveImage")
    missing = {**template, "id": 999, "type": "FarmlessUpscaler", "title": "Farmless Upscaler",
               "pos": [40, 40]}
    for port in missing.get("inputs", []):
        port["link"] = None
    workflow["nodes"].append(missing)
    page.evaluate("([w]) => window.app.loadGraphData(w, true, true, 'missing.json')", [workflow])
    # The editor marks the node missing by itself (/object_info lacks its type).
    page.wait_for_selector("text=FarmlessUpscaler", timeout=15_000)
    a.shot("missing-node-on-load")
    a.close_dialogs()
    with page.expect_response(lambda r: r.url.endswith("/api/prompt")
                              and r.request.method == "POST") as queued:
        page.click("[data-testid=queue-button]")
    answered = queued.value
    assert answered.status == 400
    body = answered.json()
    assert body["error"]["type"] == "missing_node_type", body
    assert "Farmless Upscaler" in body["error"]["message"] and "999" in body["node_errors"], body
    page.click("text=View details")  # the editor's issues panel names the node
    page.wait_for_selector("text=Farmless Upscaler", state="visible", timeout=10_000)
    a.shot("missing-node-issues")
    assert a.failures == []


def test_object_info_passes_the_editors_own_node_schema(
    editors: dict[str, Editor], stack: dict[str, str]
) -> None:
    """The bundle builds zComfyNodeDef (V1) in one chunk without exporting it: the test loads
    that chunk again with the schema kept on `globalThis`, then parses every node with it."""
    page = editors["artist-b"].page
    result = page.evaluate(
        """async () => {
            const base = new URL('./assets/', location.href).href;
            const names = performance.getEntriesByType('resource').map(e => e.name)
                .filter(n => /\\/assets\\/inputSpecTree-[^/]+\\.js$/.test(n));
            const chunk = names[0];
            if (!chunk) return {error: 'inputSpecTree chunk not loaded by the editor'};
            let code = await (await fetch(chunk)).text();
            const marker = 'r({input:R.optional(),output:V';
            if (!code.includes(marker)) return {error: 'zComfyNodeDef not found in ' + chunk};
            code = code.replace(marker, 'globalThis.__zComfyNodeDef=' + marker)
                       .replaceAll('from"./', 'from"' + base).replaceAll('import"./', 'import"' + base);
            const url = URL.createObjectURL(new Blob([code], {type: 'text/javascript'}));
            await import(url);
            const schema = globalThis.__zComfyNodeDef;
            const defs = await (await window.app.api.fetchApi('/object_info')).json();
            const bad = {};
            for (const [name, def] of Object.entries(defs)) {
                const parsed = schema.safeParse(def);
                if (!parsed.success) bad[name] = parsed.error.issues.slice(0, 3);
            }
            return {count: Object.keys(defs).length, bad};
        }""")
    assert "error" not in result, result
    assert result["count"] > 20 and result["bad"] == {}, result


def test_the_session_socket_opens_only_for_the_farms_own_pages(
    editors: dict[str, Editor], farm: Any
) -> None:
    """Browsers send cookies to any site's websocket: another origin is refused (4401)."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    cookie = "; ".join(f"{c['name']}={c['value']}" for c in editors["artist-b"].context.cookies())
    url = farm.url.replace("http", "ws") + "/comfy/ws?clientId=probe"

    def first(origin: str) -> Any:
        # Playwright's sync API holds this thread's event loop: the sync client, not asyncio.
        with connect(url, additional_headers={"Cookie": cookie, "Origin": origin}) as ws:
            try:
                return json.loads(ws.recv(timeout=10))
            except ConnectionClosed as closed:
                return closed.rcvd.code if closed.rcvd else None

    assert first(farm.url)["type"] == "status"
    assert first("https://evil.example") == 4401

