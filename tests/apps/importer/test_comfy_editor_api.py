"""What ComfyUI's editor asks of the farm, answered per user over the Django session: its page
and files, the user directory (workflows, settings), jobs, templates and the empty features;
another site's page cannot write with an artist's cookie."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from apps.importer import comfy_templates
from apps.importer.comfy_shapes import unknown_refusal

pytestmark = pytest.mark.django_db
SAME = {"Origin": "http://testserver"}


@pytest.fixture
def artist(client: Client) -> Client:
    client.force_login(get_user_model().objects.create_user("artist"))
    return client


@pytest.fixture
def stranger() -> Client:
    other = Client()
    other.force_login(get_user_model().objects.create_user("stranger"))
    return other


def test_the_editor_asks_for_a_login_then_serves_the_pinned_frontend(client: Client) -> None:
    assert client.get("/comfy/").headers["Location"] == "/login/?next=/comfy/"
    assert client.get("/login/").status_code == 200
    client.force_login(get_user_model().objects.create_user("artist"))
    page = client.get("/comfy/")
    assert page.status_code == 200 and page.headers["Cache-Control"] == "no-store"
    html = page.getvalue().decode()
    script = html.split('src="./assets/')[1].split('"')[0]
    asset = client.get(f"/comfy/assets/{script}")
    assert asset.status_code == 200 and asset.headers["Content-Type"] == "text/javascript"
    assert "immutable" in asset.headers["Cache-Control"]
    assert client.get("/comfy/assets/..%2F..%2F__init__.py").status_code == 404
    assert client.get("/comfy/api/no-such-route").status_code == 404


def test_saved_workflows_belong_to_their_artist(artist: Client, stranger: Client) -> None:
    body = json.dumps({"nodes": [], "links": []})
    saved = artist.post("/comfy/api/userdata/workflows%2Ffox.json?overwrite=false&full_info=true",
                        body, content_type="application/json", headers=SAME)
    assert saved.status_code == 200 and saved.json()["path"] == "workflows/fox.json"
    again = artist.post("/comfy/api/userdata/workflows/fox.json?overwrite=false", body,
                        content_type="application/json", headers=SAME)
    assert again.status_code == 409
    listed = artist.get("/comfy/api/userdata?dir=workflows&recurse=true&full_info=true").json()
    assert [f["path"] for f in listed] == ["fox.json"] and listed[0]["size"] == len(body)
    assert artist.get("/comfy/api/userdata/workflows/fox.json").content == body.encode()

    assert stranger.get("/comfy/api/userdata?dir=workflows&recurse=true").status_code == 404
    assert stranger.get("/comfy/api/userdata/workflows/fox.json").status_code == 404
    assert stranger.delete("/comfy/api/userdata/workflows/fox.json", headers=SAME).status_code == 404

    moved = artist.post("/comfy/api/userdata/workflows/fox.json/move/workflows/renard.json",
                        headers=SAME)
    assert moved.status_code == 200 and moved.json() == "workflows/renard.json"
    assert artist.delete("/comfy/api/userdata/workflows/renard.json", headers=SAME).status_code == 204
    assert artist.get("/comfy/api/userdata?dir=workflows").status_code == 404
    assert artist.post("/comfy/api/userdata/..%2Fescape.json", body,
                       content_type="application/json", headers=SAME).status_code == 400


def test_settings_are_kept_per_artist(artist: Client, stranger: Client) -> None:
    assert artist.get("/comfy/api/settings").json() == {}
    artist.post("/comfy/api/settings", json.dumps({"Comfy.Locale": "fr"}),
                content_type="text/plain", headers=SAME)
    artist.post("/comfy/api/settings/Comfy.TutorialCompleted", "true",
                content_type="text/plain", headers=SAME)
    assert artist.get("/comfy/api/settings").json() == {"Comfy.Locale": "fr",
                                                       "Comfy.TutorialCompleted": True}
    assert artist.get("/comfy/api/settings/Comfy.Locale").json() == "fr"
    assert stranger.get("/comfy/api/settings").json() == {}


def test_another_sites_page_cannot_write_with_an_artists_cookie(artist: Client) -> None:
    forged = artist.post("/comfy/api/settings", json.dumps({"Comfy.Locale": "xx"}),
                         content_type="text/plain", headers={"Origin": "https://evil.example"})
    assert forged.status_code == 401 and "log in at /login/" in forged.json()["error"]["message"]
    sneaked = artist.post("/comfy/api/prompt", "{}", content_type="text/plain",
                          headers={"Sec-Fetch-Site": "cross-site"})
    assert sneaked.status_code == 401
    assert artist.get("/comfy/api/settings").json() == {}


def test_the_editors_other_calls_answer_as_comfyui_does_without_the_feature(artist: Client) -> None:
    assert artist.get("/comfy/api/users").json() == {"storage": "server", "migrated": True}
    assert artist.get("/comfy/api/extensions").json() == []
    assert artist.get("/comfy/api/i18n").json() == {}
    assert artist.get("/comfy/api/workflow_templates").json() == {}
    assert artist.get("/comfy/api/global_subgraphs").json() == {}
    jobs = artist.get("/comfy/api/jobs?status=in_progress,pending&limit=200&offset=0").json()
    assert jobs == {"jobs": [], "pagination": {"offset": 0, "limit": 200, "total": 0,
                                               "has_more": False}}
    assert artist.get("/comfy/api/jobs/not-a-job").status_code == 404
    assert artist.get("/comfy/api/experiment/models").json() == []
    assert artist.get("/comfy/api/experiment/models/loras").status_code == 404
    missing = artist.get("/comfy/api/workflow_templates/farm-runs/"
                         "00000000-0000-4000-8000-000000000000.json")
    assert missing.status_code == 404


def test_the_templates_browser_lists_only_workflows_the_farm_runs(
    artist: Client, tmp_path, monkeypatch
) -> None:
    index = artist.get("/comfy/templates/index.json").json()
    assert [t["name"] for t in index[0]["templates"]] == ["farm_zimage_turbo"]
    workflow = artist.get("/comfy/templates/farm_zimage_turbo.json").json()
    assert {n["type"] for n in workflow["nodes"]} >= {"KSampler", "UNETLoader", "SaveImage"}
    assert artist.get("/comfy/templates/farm_zimage_turbo-1.webp")["Content-Type"] == "image/webp"
    # ComfyUI's own shipped workflows follow, in its groups, those that import here only.
    shipped = {t["name"]: t for group in index[1:] for t in group["templates"]}
    assert {"image_z_image_turbo", "image_qwen_image_2_1_t2i", "video_wan2_2_14B_i2v"} <= set(shipped)
    assert "image_krea2_turbo_t2i" in shipped  # its prompt enhancer (TextGenerate) runs here
    assert "api_nano_banana_pro" not in shipped  # a paid API node does the work
    assert all(comfy_templates.shipped_imports()[name] is None for name in shipped)
    assert shipped["image_qwen_image_2_1_t2i"]["usage"] > 0  # ComfyUI's own metadata kept
    qwen = artist.get("/comfy/templates/image_qwen_image_2_1_t2i.json").json()
    assert any(n["type"] == "TextEncodeQwenImage21" for s in qwen["definitions"]["subgraphs"]
               for n in s["nodes"])
    card = artist.get("/comfy/templates/image_qwen_image_2_1_t2i-1.webp")
    assert card.status_code == 200 and card["Content-Type"] == "image/webp"
    assert card.content[:4] == b"RIFF" and card.content[8:12] == b"WEBP"
    assert artist.get("/comfy/templates/image_krea2_turbo_t2i.json").status_code == 200
    assert artist.get("/comfy/templates/..%2Fcomfy_template_files%2Fx.json").status_code == 404
    french = artist.get("/comfy/templates/index.fr.json").json()
    assert {t["name"] for g in french[1:] for t in g["templates"]} == set(shipped)
    assert artist.get("/comfy/templates/index.xx.json").status_code == 404

    for name, kind in (("runs", "KSampler"), ("needs_custom", "UltimateSDUpscale")):
        (tmp_path / f"{name}.json").write_text(json.dumps({"nodes": [{"id": 1, "type": kind}]}))
    monkeypatch.setattr(comfy_templates, "FOLDER", tmp_path)
    comfy_templates.template_index.cache_clear()
    try:
        index = comfy_templates.template_index()
        assert index is not None
        listed = index[0]["templates"]
        assert [t["name"] for t in listed] == ["runs"]
        assert comfy_templates.template_file("needs_custom.json") is None
    finally:
        comfy_templates.template_index.cache_clear()


def test_a_node_sent_without_its_type_is_comfyuis_missing_node_type_naming_it() -> None:
    refused = unknown_refusal({"3": {"inputs": {}, "_meta": {"title": "Fancy Upscaler"}}})
    assert refused is not None and refused.status == 400
    assert refused.error["type"] == "missing_node_type"
    assert "Fancy Upscaler" in refused.error["message"] and "3" in refused.node_errors


def test_a_client_keys_url_opens_the_editor_without_a_login(client: Client) -> None:
    from apps.importer.comfy_door import comfy_key_create, comfy_key_revoke

    key, secret = comfy_key_create(user=get_user_model().objects.create_user("krita"))
    assert client.get(f"/comfy/k/{secret}/").status_code == 200
    assert client.get(f"/comfy/k/{secret}/api/users").status_code == 200
    comfy_key_revoke(key_id=key.pk)
    assert client.get(f"/comfy/k/{secret}/").status_code == 401


def test_an_artists_files_stay_within_their_quota(artist: Client, stranger: Client, settings) -> None:
    """Bytes and files per user (INLINE_COMFY_USERDATA_MAX_*): a write past either is ComfyUI's
    error shape, 507 Insufficient Storage (the editor's dialog shows the status and its reason
    only), naming the file and the limit, and leaves the directory as it was."""
    settings.INLINE_COMFY_USERDATA_MAX_BYTES = 100
    settings.INLINE_COMFY_USERDATA_MAX_FILES = 3

    def save(name: str, size: int, overwrite: bool = True) -> Any:
        return artist.post(f"/comfy/api/userdata/workflows%2F{name}?overwrite={overwrite}",
                           b"x" * size, content_type="application/json", headers=SAME)

    assert save("a.json", 60).status_code == 200
    over = save("b.json", 41)
    assert (over.status_code, over.reason_phrase) == (507, "Insufficient Storage")
    assert over.json()["error"]["type"] == "quota_exceeded"
    assert "'workflows/b.json'" in over.json()["error"]["message"]
    assert "100 bytes" in over.json()["error"]["message"]
    assert artist.get("/comfy/api/userdata/workflows/b.json").status_code == 404
    assert save("a.json", 101).status_code == 507  # a rewrite that grows past the limit
    assert artist.get("/comfy/api/userdata/workflows/a.json").content == b"x" * 60
    assert save("b.json", 40).status_code == 200  # exactly at the limit
    assert stranger.post("/comfy/api/userdata/workflows%2Fb.json", b"x" * 100,
                         content_type="application/json", headers=SAME).status_code == 200

    settings.INLINE_COMFY_USERDATA_MAX_BYTES = 50  # lowered: shrinking still works
    assert save("a.json", 10).status_code == 200
    settings.INLINE_COMFY_USERDATA_MAX_BYTES = 10_000
    assert save("c.json", 1).status_code == 200
    too_many = save("d.json", 1)
    assert too_many.status_code == 507 and "3 files" in too_many.json()["error"]["message"]
    moved = artist.post("/comfy/api/userdata/workflows/c.json/move/workflows/d.json", headers=SAME)
    assert moved.status_code == 200  # a move adds no file
    settings.INLINE_COMFY_USERDATA_MAX_FILES = 3
    refused = artist.post("/comfy/api/settings/Comfy.Locale", '"fr"', content_type="text/plain",
                          headers=SAME)  # settings are a file of the directory too
    assert refused.status_code == 507 and refused.json()["error"]["type"] == "quota_exceeded"
    assert artist.get("/comfy/api/settings").json() == {}
    listed = artist.get("/comfy/api/userdata?dir=workflows&full_info=true").json()
    assert sorted((f["path"], f["size"]) for f in listed) == [
        ("a.json", 10), ("b.json", 40), ("d.json", 1)]


def test_a_deactivated_or_logged_out_artist_is_refused(client: Client) -> None:
    user = get_user_model().objects.create_user("leaving")
    client.force_login(user)
    assert client.get("/comfy/api/settings").status_code == 200
    user.is_active = False
    user.save(update_fields=["is_active"])
    refused = client.get("/comfy/api/settings")
    assert refused.status_code == 401 and refused.json()["error"]["type"] == "unauthorized"
    assert client.get("/comfy/")["Location"] == "/login/?next=/comfy/"
    user.is_active = True
    user.save(update_fields=["is_active"])
    client.force_login(user)
    client.logout()
    assert client.get("/comfy/api/jobs").status_code == 401


def test_the_editors_history_links_each_job_to_its_run_and_takes(
    artist: Client, stranger: Client, data_dirs: Any
) -> None:
    """A finished job's preview and outputs carry the URL of the take's bytes at the door the
    artist came by (the editor opens `url` when an output is clicked), and `farm` names the run
    and every take; the key URL gets links with its key; staff also get the admin's run page."""
    from django.utils import timezone

    from apps.graphs.models import Graph
    from apps.importer.comfy_door import comfy_key_create
    from apps.importer.models import ComfyPrompt
    from apps.runs.models import Run
    from apps.takes.models import Take
    from apps.takes.storage import blob_put
    from tests.conftest import png

    owner = get_user_model().objects.get(username="artist")
    graph = Graph.objects.create(sha256="e" * 64, document={"nodes": {
        "9": {"type": "image/save", "params": {}, "inputs": {}}}})
    run = Run.objects.create(owner=owner, graph=graph, target="9", status="succeeded",
                             started_at=timezone.now(), finished_at=timezone.now())
    data = png(8, 6)
    takes = [Take.objects.create(run=run, owner=owner, node_id="9", index=i, sha256=blob_put(data),
                                 media_type="image/png", size=len(data), width=8, height=6)
             for i in range(2)]
    prompt = ComfyPrompt.objects.create(number=1, owner=owner, run=run, outputs=["9"],
                                        prompt={"9": {"class_type": "SaveImage", "inputs": {}}})

    job = artist.get("/comfy/api/jobs?status=completed").json()["jobs"][0]
    first = f"{takes[0].id}.png"
    assert job["preview_output"]["url"] == (
        f"/comfy/api/view?filename={first}&subfolder=&type=output")
    opened = artist.get(job["preview_output"]["url"])
    assert opened.status_code == 200 and opened["Content-Type"] == "image/png"
    assert opened.getvalue() == data
    farm = job["farm"]
    assert farm["run_id"] == str(run.pk) and farm["run_url"] is None
    assert [t["id"] for t in farm["takes"]] == [str(t.id) for t in takes]
    assert all(artist.get(t["url"]).status_code == 200 for t in farm["takes"])
    assert stranger.get(farm["takes"][1]["url"]).status_code == 404

    detail = artist.get(f"/comfy/api/jobs/{prompt.pk}").json()
    assert [i["url"] for i in detail["outputs"]["9"]["images"]] == [t["url"] for t in farm["takes"]]
    entry = artist.get(f"/comfy/history/{prompt.pk}").json()[str(prompt.pk)]
    assert entry["outputs"]["9"]["images"][0]["url"] == f"/comfy/view?filename={first}&subfolder=&type=output"
    assert entry["farm"]["run_id"] == str(run.pk) and len(entry["farm"]["takes"]) == 2

    _, secret = comfy_key_create(user=owner)
    keyed = Client().get(f"/comfy/k/{secret}/api/jobs").json()["jobs"][0]["preview_output"]["url"]
    assert keyed.startswith(f"/comfy/k/{secret}/api/view?") and Client().get(keyed).status_code == 200

    owner.is_staff = True
    owner.save(update_fields=["is_staff"])
    run_url = artist.get("/comfy/api/jobs").json()["jobs"][0]["farm"]["run_url"]
    assert run_url == f"/admin/runs/run/{run.pk}/change/"


def test_removing_jobs_from_the_editors_history_sticks_for_that_artist_only(
    artist: Client, stranger: Client, data_dirs: Any
) -> None:
    """ComfyUI's `POST /history {delete: [ids]}` / `{clear: true}`, as the editor's queue and
    assets panels send them: the jobs leave that artist's /history and /api/jobs for good (a new
    session sees the same), a job still in flight is not touched (it shows once it finishes),
    another artist's ids are ignored, and nothing of the farm's record goes: prompts, runs and
    takes stay and a take's bytes still open."""
    from django.utils import timezone

    from apps.graphs.models import Graph
    from apps.importer.models import ComfyPrompt
    from apps.runs.models import Run
    from apps.takes.models import Take
    from apps.takes.storage import blob_put
    from tests.conftest import png

    users = get_user_model().objects
    graph = Graph.objects.create(sha256="f" * 64, document={"nodes": {
        "9": {"type": "image/save", "params": {}, "inputs": {}}}})

    def job(owner: Any, number: int, status: str) -> ComfyPrompt:
        done = timezone.now() if status != "queued" else None
        run = Run.objects.create(owner=owner, graph=graph, target="9", status=status,
                                 started_at=timezone.now(), finished_at=done)
        return ComfyPrompt.objects.create(number=number, owner=owner, run=run, outputs=["9"],
                                          prompt={"9": {"class_type": "SaveImage", "inputs": {}}})

    artist_user, stranger_user = users.get(username="artist"), users.get(username="stranger")
    done, failed, pending = (job(artist_user, 1, "succeeded"), job(artist_user, 2, "failed"),
                             job(artist_user, 3, "queued"))
    theirs = job(stranger_user, 1, "succeeded")
    data = png(4, 4)
    take = Take.objects.create(run=done.run, owner=artist_user, node_id="9", index=0,
                               sha256=blob_put(data), media_type="image/png", size=len(data),
                               width=4, height=4)

    def post(who: Client, body: Any) -> int:
        return who.post("/comfy/api/history", json.dumps(body), content_type="application/json",
                        headers=SAME).status_code

    def seen(who: Client) -> tuple[set[str], set[str]]:
        return (set(who.get("/comfy/api/history").json()),
                {j["id"] for j in who.get("/comfy/api/jobs").json()["jobs"]})

    assert post(artist, {"delete": [str(done.pk), str(theirs.pk), str(pending.pk), "x", 7]}) == 200
    assert seen(artist) == ({str(failed.pk)}, {str(failed.pk), str(pending.pk)})
    assert artist.get(f"/comfy/history/{done.pk}").json() == {}
    assert artist.get(f"/comfy/api/jobs/{done.pk}").status_code == 404
    assert artist.get(f"/comfy/api/view?filename={take.pk}.png&type=output").getvalue() == data
    assert seen(stranger) == ({str(theirs.pk)}, {str(theirs.pk)})  # not theirs to remove

    assert post(stranger, {"delete": [str(failed.pk)]}) == 200  # the artist's: ignored
    assert post(stranger, {"delete": "nonsense"}) == 200  # ComfyUI ignores what it cannot use
    assert str(failed.pk) in seen(artist)[0]

    assert post(artist, {"clear": True}) == 200
    assert seen(artist) == (set(), {str(pending.pk)})
    Run.objects.filter(pk=pending.run_id).update(status="succeeded", finished_at=timezone.now())
    later = job(artist_user, 4, "succeeded")
    fresh = Client()  # another session, as after a reload or a farm restart: the marks are kept
    fresh.force_login(artist_user)
    both = {str(pending.pk), str(later.pk)}
    assert seen(fresh) == (both, both)
    assert seen(stranger) == ({str(theirs.pk)}, {str(theirs.pk)})
    assert ComfyPrompt.objects.count() == 5 and Run.objects.count() == 5
    assert Take.objects.filter(pk=take.pk).exists()
