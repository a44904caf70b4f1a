"""Sound uploads through /v1/assets (issue ia2v): MP3, WAV, FLAC, Ogg / Opus and M4A files,
sniffed from their bytes with PyAV, become `audio/*` assets; junk that only looks like one is a
415; audio/load takes only sound assets, and a loaded, trimmed sound becomes a clip's track."""

from __future__ import annotations

import pytest

from tests.api.conftest import assert_error
from tests.conftest import png, upload
from tests.workers.vocab_helpers import sound_file

pytestmark = pytest.mark.e2e

TYPES = {"mp3": "audio/mpeg", "wav": "audio/wav", "flac": "audio/flac", "ogg": "audio/ogg",
         "m4a": "audio/mp4"}


def _wire(node: str, port: str) -> dict[str, str]:
    return {"node": node, "port": port}


@pytest.mark.parametrize("fmt", list(TYPES))
def test_a_sound_file_uploads_as_an_audio_asset(owner, fmt):
    data = sound_file(fmt, seconds=0.5)
    response = upload(owner, data, f"voice.{fmt}", "application/octet-stream")
    assert response.status_code == 201, response.text
    asset = response.json()
    assert (asset["mediaType"], asset["width"], asset["height"]) == (TYPES[fmt], None, None)
    again = upload(owner, data, f"voice.{fmt}", "audio/whatever")
    assert again.status_code == 200 and again.json()["id"] == asset["id"]


@pytest.mark.parametrize("junk", [
    b"ID3\x04\x00\x00\x00\x00\x00\x00" + b"\x00" * 300,        # an MP3 tag, then nothing
    b"RIFF\x24\x00\x00\x00WAVEfmt " + b"\x00" * 300,            # a WAV header, no samples
    b"OggS" + b"\x00" * 300,
    b"fLaC" + b"\xff" * 300,
    b"\x00\x00\x00\x1cftypM4A \x00\x00\x02\x00" + b"\x00" * 300,  # an M4A's first box only
], ids=["mp3", "wav", "ogg", "flac", "m4a"])
def test_an_upload_that_only_looks_like_sound_is_a_415(owner, junk):
    error = assert_error(upload(owner, junk, "x.mp3", "audio/mpeg"), 415,
                         "unsupported_media_type")
    assert "sound" in error["message"]


def test_audio_load_takes_only_sound_and_a_trimmed_sound_becomes_a_clip_s_track(owner):
    still = upload(owner, png(16, 16, (200, 30, 30))).json()["id"]
    sound = upload(owner, sound_file("wav", seconds=1.0), "voice.wav", "audio/wav").json()["id"]
    refused = owner.post("/v1/runs", json={"graph": {"nodes": {
        "src": {"type": "audio/load", "params": {"asset": still}},
        "cut": {"type": "audio/trim", "inputs": {"audio": _wire("src", "audio")}},
        "pic": {"type": "image/load", "params": {"asset": still}},
        "frames": {"type": "frames/from-images", "params": {"hold": 4},
                   "inputs": {"image": _wire("pic", "image")}},
        "clip": {"type": "video/create", "params": {"fps": 8},
                 "inputs": {"frames": _wire("frames", "frames"), "audio": _wire("cut", "audio")}},
        "out": {"type": "video/save", "inputs": {"video": _wire("clip", "video")}}}},
        "target": "out"})
    error = assert_error(refused, 422, "asset_wrong_media")
    assert error["nodeId"] == "src" and "a sound file" in error["message"]
    graph = {"graph": {"nodes": {
        "src": {"type": "audio/load", "params": {"asset": sound}},
        "cut": {"type": "audio/trim", "params": {"start": 0.25, "duration": 0.5},
                "inputs": {"audio": _wire("src", "audio")}},
        "pic": {"type": "image/load", "params": {"asset": still}},
        "frames": {"type": "frames/from-images", "params": {"hold": 4},
                   "inputs": {"image": _wire("pic", "image")}},
        "clip": {"type": "video/create", "params": {"fps": 8},
                 "inputs": {"frames": _wire("frames", "frames"), "audio": _wire("cut", "audio")}},
        "out": {"type": "video/save", "inputs": {"video": _wire("clip", "video")}}}},
        "target": "out"}
    response = owner.post("/v1/runs", json=graph)
    assert response.status_code in (200, 201, 202), response.text
    run = owner.wait_run(response.json()["runId"], timeout=120)
    assert run["status"] == "succeeded", run
    [take] = run["takes"]
    assert take["audioSeconds"] == pytest.approx(0.5, abs=0.03)
