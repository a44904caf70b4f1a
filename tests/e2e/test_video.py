"""Video takes through /v1 on a real worker: images and an uploaded clip's sound become an MP4
take (the same bytes on every run), decoded back with PyAV; WebM and animated WebP takes; the
poster; Range on a clip; video uploads."""

from __future__ import annotations

import hashlib
import io
import json
from typing import Any

import av
import numpy as np
import pytest
from PIL import Image

from tests.api.conftest import assert_error
from tests.conftest import upload
from tests.workers.test_video import CRF0_LEVELS, smooth_frames, tone
from workers.models.values import Frames, Video

pytestmark = pytest.mark.e2e

W, H, FPS, HOLD = 64, 48, 24, 4
ARRAYS = smooth_frames(count=3)  # three pictures, each held HOLD frames: 12 frames, 0.5 s


def _png(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array).save(out, format="PNG")
    return out.getvalue()


def _mp4_with_sound(tmp_path: Any) -> bytes:
    """A clip to upload: 6 frames at 12 fps and 0.5 s of stereo sound."""
    from workers.video import video_write

    path = tmp_path / "upload.mp4"
    video_write(Video(Frames(smooth_frames(count=6)), 12.0, tone(0.5)), path, format="mp4",
                crf=30, comment="{}")
    return path.read_bytes()


def _wire(node: str, port: str) -> dict[str, str]:
    return {"node": node, "port": port}


def _graph(nodes: dict[str, Any], target: str = "out") -> dict[str, Any]:
    return {"graph": {"nodes": nodes}, "target": target}


def _images_with_sound(images: list[str], clip: str, **save: Any) -> dict[str, Any]:
    """Three uploaded images → frames; the uploaded clip's sound; → video/save."""
    nodes: dict[str, Any] = {f"i{n}": {"type": "image/load", "params": {"asset": a}}
                             for n, a in enumerate(images)}
    nodes |= {
        "frames": {"type": "frames/from-images", "params": {"hold": HOLD},
                   "inputs": {"image": _wire("i0", "image"), "image2": _wire("i1", "image"),
                              "image3": _wire("i2", "image")}},
        "clip": {"type": "video/load", "params": {"asset": clip}},
        "parts": {"type": "video/components", "inputs": {"video": _wire("clip", "video")}},
        "made": {"type": "video/create", "params": {"fps": FPS},
                 "inputs": {"frames": _wire("frames", "frames"), "audio": _wire("parts", "audio")}},
        "out": {"type": "video/save", "params": save, "inputs": {"video": _wire("made", "video")}},
    }
    return _graph(nodes)


def _run(owner: Any, body: dict[str, Any]) -> dict[str, Any]:
    response = owner.post("/v1/runs", json=body)
    assert response.status_code in (200, 201, 202), response.text
    run = owner.wait_run(response.json()["runId"], timeout=120)
    assert run["status"] == "succeeded", run
    [take] = run["takes"]
    return take


def _decoded(data: bytes) -> tuple[np.ndarray, float, float | None, dict[str, str]]:
    with av.open(io.BytesIO(data), "r") as clip:
        stream = clip.streams.video[0]
        frames = np.stack([f.to_ndarray(format="rgb24") for f in clip.decode(stream)])
        fps = float(stream.average_rate or 0)
        meta = {k.lower(): v for k, v in clip.metadata.items()}
    with av.open(io.BytesIO(data), "r") as clip:
        samples = [f.samples for f in clip.decode(audio=0)] if clip.streams.audio else None
        sound = sum(samples) / clip.streams.audio[0].rate if samples is not None else None
    return frames, fps, sound, meta


def test_images_and_a_clips_sound_make_an_mp4_take_with_the_same_bytes_on_every_run(
        owner, tmp_path):
    images = [upload(owner, _png(a)).json()["id"] for a in ARRAYS]
    clip = upload(owner, _mp4_with_sound(tmp_path), "clip.mp4", "video/mp4").json()
    assert (clip["mediaType"], clip["width"], clip["height"]) == ("video/mp4", W, H)

    first = _run(owner, _images_with_sound(images, clip["id"], crf=0, label="take"))
    second = _run(owner, {**_images_with_sound(images, clip["id"], crf=0, label="take"),
                          "clientRunId": "video-again"})
    assert first["id"] != second["id"] and first["sha256"] == second["sha256"]
    assert first["mediaType"] == "video/mp4" and (first["width"], first["height"]) == (W, H)
    assert (first["frameCount"], first["fps"], first["durationSeconds"]) == (12, 24.0, 0.5)
    assert first["audioSeconds"] == pytest.approx(0.5, abs=0.03)
    assert owner.get(f"/v1/takes/{first['id']}").json() == first

    data = owner.get(first["bytesUrl"]).content
    assert hashlib.sha256(data).hexdigest() == first["sha256"]
    frames, fps, sound, meta = _decoded(data)
    assert frames.shape == (12, H, W, 3) and fps == 24.0
    assert sound == pytest.approx(0.5, abs=0.03)
    expected = np.repeat(ARRAYS, HOLD, axis=0).astype(int)
    assert np.abs(frames.astype(int) - expected).max() <= CRF0_LEVELS
    lineage = json.loads(meta["comment"])
    assert lineage["graphSha256"] == first["graphSha256"]
    assert lineage["nodeType"] == "video/save" and lineage["label"] == "take"

    part = owner.get(first["bytesUrl"], headers={"Range": "bytes=100-199"})
    assert part.status_code == 206 and part.content == data[100:200]
    assert part.headers["content-type"] == "video/mp4"

    poster = owner.get(first["posterUrl"])
    assert poster.status_code == 200 and poster.headers["content-type"] == "image/png"
    picture = np.asarray(Image.open(io.BytesIO(poster.content)).convert("RGB")).astype(int)
    assert picture.shape == (H, W, 3) and np.abs(picture - ARRAYS[0]).max() <= CRF0_LEVELS + 2
    assert owner.get(first["posterUrl"],
                     headers={"If-None-Match": poster.headers["etag"]}).status_code == 304


def test_a_clip_remuxes_to_webm_and_frames_to_an_animated_webp(owner, outsider, tmp_path):
    clip = upload(owner, _mp4_with_sound(tmp_path), "clip.mp4", "video/mp4").json()["id"]
    webm = _run(owner, _graph({
        "clip": {"type": "video/load", "params": {"asset": clip}},
        "out": {"type": "video/save", "params": {"format": "webm", "crf": 40},
                "inputs": {"video": _wire("clip", "video")}}}))
    assert webm["mediaType"] == "video/webm"
    assert (webm["frameCount"], webm["fps"]) == (6, 12.0)
    frames, fps, sound, _ = _decoded(owner.get(webm["bytesUrl"]).content)
    assert frames.shape[0] == 6 and fps == 12.0 and sound == pytest.approx(0.5, abs=0.03)

    anim = _run(owner, _graph({
        "clip": {"type": "video/load", "params": {"asset": clip}},
        "parts": {"type": "video/components", "inputs": {"video": _wire("clip", "video")}},
        "out": {"type": "image/save-animated-webp", "params": {"fps": 5},
                "inputs": {"frames": _wire("parts", "frames")}}}))
    assert anim["mediaType"] == "image/webp"
    assert (anim["frameCount"], anim["fps"], anim["audioSeconds"]) == (6, 5.0, None)
    image = Image.open(io.BytesIO(owner.get(anim["bytesUrl"]).content))
    assert getattr(image, "n_frames", 1) == 6
    poster = Image.open(io.BytesIO(owner.get(anim["posterUrl"]).content))
    assert poster.format == "PNG" and poster.size == (W, H)
    assert_error(outsider.get(anim["posterUrl"]), 404, "not_found")


def test_a_still_takes_fields_are_null_and_its_poster_is_the_image(owner):
    asset = upload(owner, _png(ARRAYS[1])).json()["id"]
    take = _run(owner, _graph({
        "src": {"type": "image/load", "params": {"asset": asset}},
        "out": {"type": "image/save", "inputs": {"image": _wire("src", "image")}}}))
    assert [take[k] for k in ("frameCount", "fps", "durationSeconds", "audioSeconds")] == [None] * 4
    poster = np.asarray(Image.open(io.BytesIO(owner.get(take["posterUrl"]).content)))
    assert np.array_equal(poster, ARRAYS[1])


def test_an_upload_that_only_looks_like_a_video_is_refused_and_loads_want_their_media(
        owner, tmp_path):
    fake = b"\x00\x00\x00\x18ftypisom" + b"\x00" * 200
    assert_error(upload(owner, fake, "x.mp4", "video/mp4"), 415, "unsupported_media_type")
    still = upload(owner, _png(ARRAYS[0])).json()["id"]
    refused = owner.post("/v1/runs", json=_graph({
        "clip": {"type": "video/load", "params": {"asset": still}},
        "out": {"type": "video/save", "inputs": {"video": _wire("clip", "video")}}}))
    error = assert_error(refused, 422, "asset_wrong_media")
    assert error["nodeId"] == "clip" and "image/png" in error["message"]
    clip = upload(owner, _mp4_with_sound(tmp_path), "clip.mp4", "video/mp4").json()["id"]
    refused = owner.post("/v1/runs", json=_graph({
        "src": {"type": "image/load", "params": {"asset": clip}},
        "out": {"type": "image/save", "inputs": {"image": _wire("src", "image")}}}))
    error = assert_error(refused, 422, "asset_wrong_media")
    assert error["nodeId"] == "src" and "takes an image" in error["message"]


def test_a_comfyui_client_saves_a_video_and_reads_it_back_as_comfyui_answers(farm, personas,
                                                                               tmp_path):
    import uuid

    from tests.apps.importer.test_comfy_door_e2e import ComfyClient

    comfy = ComfyClient(f"{farm.url}/comfy", personas["owner"])
    uploaded = comfy.http.post("/upload/image", files={
        "image": ("clip.mp4", _mp4_with_sound(tmp_path), "video/mp4")})
    assert uploaded.status_code == 200, uploaded.text
    prompt = {
        "1": {"class_type": "LoadVideo", "inputs": {"file": uploaded.json()["name"]}},
        "2": {"class_type": "SaveVideo", "inputs": {
            "video": ["1", 0], "filename_prefix": "video/clip", "format": "webm",
            "codec": "vp9"}},
    }
    client_id = uuid.uuid4().hex
    with comfy.socket(client_id) as ws:
        ws.recv(timeout=10)
        queued = comfy.queue(prompt, client_id)
        assert queued.status_code == 200, queued.text
        prompt_id = queued.json()["prompt_id"]
        messages = comfy.messages_until_done(ws, prompt_id)
    executed = next(m for m in messages if m["type"] == "executed")
    # ComfyUI 0.3.x's SaveVideo: ui.PreviewVideo → {"images": [...], "animated": (True,)}
    assert executed["data"]["output"]["animated"] == [True]
    entry = comfy.history(prompt_id)[prompt_id]
    output = entry["outputs"]["2"]
    # /history's outputs also carry each take's `url` (the editor opens it: issue 39)
    assert output["animated"] == [True] and [
        {k: v for k, v in i.items() if k != "url"} for i in output["images"]
    ] == executed["data"]["output"]["images"]
    assert "/view?filename=" in output["images"][0]["url"]
    assert output["images"][0]["filename"].endswith(".webm")
    viewed = comfy.view(output["images"][0])
    assert viewed.status_code == 200 and viewed.headers["content-type"] == "video/webm"
    assert _decoded(viewed.content)[0].shape[0] == 6
