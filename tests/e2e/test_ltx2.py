"""LTX-2 through /v1 on a real worker (issue 37): text-to-video graphs on the tiny stack
(checkpoints/smoke-ltx2, an LTX2Pipeline folder) give an MP4 take (H.264 + AAC) whose frames,
fps and sound length are the clip's; two runs queued at once share forwards (`batch` > 1 in
their progress) and each equals its solo render within rounding; the same weights as ComfyUI's
all-in-one file (checkpoints/smoke-ltx2-file.safetensors + its .diffusers/ configs) render the
folder's clip."""

from __future__ import annotations

import io
import time
from typing import Any

import av
import numpy as np
import pytest

from tests.livefarm import Client

pytestmark = pytest.mark.e2e

W, H, FRAMES, FPS, STEPS = 32, 32, 9, 25.0, 3
PROMPT = "a paper lantern drifting on a river"


@pytest.fixture(scope="module")
def ltx2(farm, data_dirs, personas) -> str:
    """The tiny LTX-2 stack in the worker's models dir, once its heartbeat reports it."""
    from workers.models.ltx2.tiny import write_tiny_stack

    return reported(farm, personas, write_tiny_stack(data_dirs["models"])["checkpoint"])


@pytest.fixture(scope="module")
def ltx2_file(farm, data_dirs, personas) -> str:
    """The same tiny stack as ComfyUI's single file, once the worker's heartbeat reports it."""
    from workers.models.ltx2.tiny import write_tiny_single_file

    return reported(farm, personas, write_tiny_single_file(data_dirs["models"])["checkpoint"])


def reported(farm: Any, personas: dict[str, str], name: str) -> str:
    deadline = time.monotonic() + 30
    with Client(base_url=farm.url, headers={"Authorization": f"Bearer {personas['owner']}"},
                timeout=30) as client:
        while time.monotonic() < deadline:
            files = client.get("/v1/models/files?family=ltx2").json()["files"]
            if name in {f["name"] for f in files}:
                return name
            time.sleep(0.2)
    raise AssertionError("no worker reported the LTX-2 smoke stack")


def graph(name: str, *, seed: int, prompt: str, label: str = "") -> dict[str, Any]:
    def wire(node: str, port: str) -> dict[str, str]:
        return {"node": node, "port": port}

    return {"graph": {"nodes": {
        "ckpt": {"type": "load/checkpoint", "params": {"file": name}},
        "pos": {"type": "encode/text", "params": {"text": prompt},
                "inputs": {"encoder": wire("ckpt", "encoder")}},
        "empty": {"type": "ltx2/empty-latent",
                  "params": {"width": W, "height": H, "length": FRAMES, "fps": FPS}},
        "sample": {"type": "ltx2/sample", "params": {"steps": STEPS, "seed": seed,
                                                     "stg_blocks": "1"},
                   "inputs": {"model": wire("ckpt", "model"), "positive": wire("pos", "conditioning"),
                              "latent": wire("empty", "latent")}},
        "decode": {"type": "ltx2/decode", "inputs": {"vae": wire("ckpt", "vae"),
                                                     "latent": wire("sample", "latent")}},
        "out": {"type": "video/save", "params": {"crf": 0, "label": label},
                "inputs": {"video": wire("decode", "video")}},
    }}, "target": "out"}


def decoded(owner: Any, take: dict[str, Any]) -> tuple[np.ndarray, float, float]:
    data = owner.get(take["bytesUrl"]).content
    with av.open(io.BytesIO(data), "r") as clip:
        stream = clip.streams.video[0]
        frames = np.stack([f.to_ndarray(format="rgb24") for f in clip.decode(stream)])
        fps = float(stream.average_rate or 0)
    with av.open(io.BytesIO(data), "r") as clip:
        assert clip.streams.audio, "an LTX-2 clip has a sound track"
        rate = clip.streams.audio[0].rate
        sound = sum(f.samples for f in clip.decode(audio=0)) / rate
    return frames, fps, sound


def test_two_ltx2_runs_make_mp4_takes_share_forwards_and_equal_their_solo_renders(owner, ltx2,
                                                                              db_access):
    from apps.runs.models import RunEvent

    runs = [(3, PROMPT), (4, "a kite over dunes")]
    posted = [owner.post("/v1/runs", json=graph(ltx2, seed=s, prompt=p)) for s, p in runs]
    assert all(r.status_code == 201 for r in posted), [r.text for r in posted]
    done = [owner.wait_run(r.json()["runId"], timeout=120) for r in posted]
    assert all(run["status"] == "succeeded" for run in done), done
    batches = [int(e.payload.get("batch") or 1) for run in done
               for e in RunEvent.objects.filter(run_id=run["id"], type="progress")]
    assert len(batches) == 2 * STEPS and max(batches) > 1, batches

    # the same prompt (stripped) and seed, alone; its new text leaves no node of it cached
    solo_post = owner.post("/v1/runs", json=graph(ltx2, seed=3, prompt=PROMPT + " ", label="solo"))
    assert solo_post.status_code == 201, solo_post.text
    solo = owner.wait_run(solo_post.json()["runId"], timeout=120)
    [solo_take] = solo["takes"]
    alone, _, _ = decoded(owner, solo_take)
    for run in done:
        [take] = run["takes"]
        assert take["mediaType"] == "video/mp4" and (take["width"], take["height"]) == (W, H)
        assert (take["frameCount"], take["fps"]) == (FRAMES, FPS)
        # the sound lasts the clip (its audio latents: 25 per second, less the causal 3 hops)
        assert take["audioSeconds"] == pytest.approx(FRAMES / FPS, abs=0.08)
        frames, fps, sound = decoded(owner, take)
        assert frames.shape == (FRAMES, H, W, 3) and fps == FPS
        assert sound == pytest.approx(FRAMES / FPS, abs=0.08)
    together, _, _ = decoded(owner, done[0]["takes"][0])
    assert np.abs(together.astype(int) - alone).max() <= 2  # crf 0 H.264 of frames ±1 apart


def test_comfyui_s_single_file_renders_the_folder_s_clip(owner, ltx2, ltx2_file):
    posted = [owner.post("/v1/runs", json=graph(name, seed=11, prompt=PROMPT, label=name))
              for name in (ltx2, ltx2_file)]
    assert all(r.status_code == 201 for r in posted), [r.text for r in posted]
    done = [owner.wait_run(r.json()["runId"], timeout=120) for r in posted]
    assert all(run["status"] == "succeeded" for run in done), done
    (folder,), (file,) = (run["takes"] for run in done)
    folder_frames, _, folder_sound = decoded(owner, folder)
    file_frames, fps, file_sound = decoded(owner, file)
    assert file_frames.shape == (FRAMES, H, W, 3) and fps == FPS
    assert np.array_equal(file_frames, folder_frames) and file_sound == folder_sound
