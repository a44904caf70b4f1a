"""Video takes on the worker side (workers/video.py, workers/runners/video.py): frames (+ sound)
encode to MP4 (H.264 + AAC), WebM (VP9 + Opus) and animated WebP with the same bytes every time,
and decode back with PyAV to the frames, rate and sound that went in."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
from PIL import Image

from workers.models.values import Audio, Frames, Video
from workers.video import video_read, video_write, webp_animated

W, H, COUNT, FPS = 64, 48, 12, 24.0
# crf 0 through 4:2:0 YUV and back: the error is the colour conversions' rounding and the
# subsampling of smooth chroma (measured: 4 levels at most, 1.3 on average, on these frames;
# the bytes are deterministic, so this bound cannot flake)
CRF0_LEVELS = 4


def smooth_frames(count: int = COUNT, width: int = W, height: int = H) -> np.ndarray:
    """[F, H, W, 3] uint8: gradients that move from frame to frame (no hard edges)."""
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    frames = [np.stack([40 + 150 * xx / width + 3 * i, 40 + 150 * yy / height + 2 * i,
                        np.full_like(xx, 120.0 - 4 * i)], -1) for i in range(count)]
    return np.clip(np.stack(frames), 0, 255).astype(np.uint8)


def tone(seconds: float, rate: int = 44100) -> Audio:
    t = np.arange(int(seconds * rate)) / rate
    return Audio(0.4 * np.stack([np.sin(2 * np.pi * 440 * t), np.sin(2 * np.pi * 660 * t)])
                 .astype(np.float32), rate)


def encode(tmp_path: Path, video: Video, fmt: str, crf: int, name: str = "clip") -> Path:
    path = tmp_path / f"{name}.{fmt}"
    video_write(video, path, format=fmt, crf=crf, comment=json.dumps({"runId": "r1"}))
    return path


@pytest.mark.parametrize("fmt", ["mp4", "webm"])
def test_the_same_frames_encode_to_the_same_bytes_and_decode_back(tmp_path, fmt):
    frames = smooth_frames()
    video = Video(Frames(frames), FPS, tone(0.5))
    first, second = encode(tmp_path, video, fmt, 0, "a"), encode(tmp_path, video, fmt, 0, "b")
    assert hashlib.sha256(first.read_bytes()).digest() == hashlib.sha256(
        second.read_bytes()).digest()
    back = video_read(str(first), max_bytes=1 << 30)
    assert back.frames.count == COUNT and back.fps == FPS
    assert (back.frames.width, back.frames.height) == (W, H)
    assert back.audio is not None
    # AAC pads to whole 1024-sample frames (and primes); Opus to 20 ms: within one frame's worth
    assert back.audio.seconds == pytest.approx(0.5, abs=0.03)
    error = np.abs(back.frames.array.astype(int) - frames.astype(int)).max()
    assert error <= CRF0_LEVELS, f"{fmt} at crf 0 is {error} levels off"
    with av.open(str(first)) as clip:
        comment = {k.lower(): v for k, v in clip.metadata.items()}["comment"]
        assert json.loads(comment) == {"runId": "r1"}
        assert clip.streams.video[0].codec_context.name == {"mp4": "h264", "webm": "vp9"}[fmt]
        assert clip.streams.audio[0].codec_context.name == {"mp4": "aac", "webm": "opus"}[fmt]


def test_a_higher_crf_makes_a_smaller_file_and_no_sound_makes_no_audio_stream(tmp_path):
    video = Video(Frames(smooth_frames()), FPS)
    best, small = encode(tmp_path, video, "mp4", 0, "best"), encode(tmp_path, video, "mp4", 35)
    assert small.stat().st_size < best.stat().st_size
    with av.open(str(small)) as clip:
        assert not clip.streams.audio


def test_a_clip_whose_frames_exceed_the_memory_budget_is_refused_while_decoding(tmp_path):
    path = encode(tmp_path, Video(Frames(smooth_frames()), FPS), "webm", 40)
    with pytest.raises(ValueError, match="after 5 frames"):
        video_read(str(path), max_bytes=W * H * 3 * 5)


def test_odd_sides_are_refused_not_cropped(tmp_path):
    with pytest.raises(ValueError, match="63x48"):
        encode(tmp_path, Video(Frames(smooth_frames(width=63)), FPS), "mp4", 19)


def test_an_animated_webp_has_every_frame_at_the_frame_rate_and_the_same_bytes():
    frames = Frames(smooth_frames(count=5))
    data = webp_animated(frames, 10.0, quality=90, lossless=True, text="{}")
    assert data == webp_animated(frames, 10.0, quality=90, lossless=True, text="{}")
    image = Image.open(io.BytesIO(data))
    assert getattr(image, "n_frames", 1) == 5
    image.seek(3)
    image.load()
    assert image.info["duration"] == 100  # ms: 10 fps
    assert np.array_equal(np.asarray(image.convert("RGB")), frames.array[3])


# --- the nodes, through the real executor (tests/workers/vocab_helpers.py) ----------------------


@pytest.fixture
def _blobs(settings: Any, tmp_path: Any) -> None:
    settings.INLINE_BLOB_DIR = tmp_path / "blobs"


@pytest.mark.django_db
@pytest.mark.usefixtures("_blobs")
def test_images_become_a_video_take_with_its_clip_facts_and_lineage():
    from apps.takes.storage import blob_path
    from tests.workers.vocab_helpers import asset_of, render, wire

    arrays = smooth_frames(count=2)
    nodes = {
        "a": {"type": "image/load", "params": {"asset": asset_of(Image.fromarray(arrays[0]))}},
        "b": {"type": "image/load", "params": {"asset": asset_of(Image.fromarray(arrays[1]))}},
        "frames": {"type": "frames/from-images", "params": {"hold": 3},
                   "inputs": {"image": wire("a", "image"), "image2": wire("b", "image")}},
        "clip": {"type": "video/create", "params": {"fps": 12},
                 "inputs": {"frames": wire("frames", "frames")}},
        "out": {"type": "video/save", "params": {"format": "webm", "crf": 30, "label": "v"},
                "inputs": {"video": wire("clip", "video")}},
    }
    outcome, run = render(nodes, "out")
    assert outcome.status == "succeeded", outcome.error
    [take] = run.takes.all()
    assert take.media_type == "video/webm" and (take.width, take.height) == (W, H)
    assert (take.frame_count, take.fps, take.duration_seconds, take.audio_seconds) == (
        6, 12.0, 0.5, None)
    assert take.lineage["label"] == "v" and take.lineage["nodeType"] == "video/save"
    path = blob_path(take.sha256)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == take.sha256 == take.sha256
    assert take.size == path.stat().st_size
    assert not list((path.parent.parent / ".staging").iterdir())  # the staged file was renamed
    assert video_read(str(path), max_bytes=1 << 30).frames.count == 6


@pytest.mark.usefixtures("_blobs")
def test_staged_files_a_dead_attempt_left_are_swept_and_fresh_ones_kept():
    import os

    from apps.takes.storage import blob_stage_file

    old, fresh = blob_stage_file(), blob_stage_file()
    os.utime(old, (0, 0))
    blob_stage_file()
    assert not old.exists() and fresh.exists()


@pytest.mark.django_db
@pytest.mark.usefixtures("_blobs")
def test_images_of_different_sizes_fail_the_frames_node_by_name():
    from tests.workers.vocab_helpers import asset_of, render, wire

    nodes = {
        "a": {"type": "image/load", "params": {"asset": asset_of(Image.new("RGB", (32, 32)))}},
        "b": {"type": "image/load", "params": {"asset": asset_of(Image.new("RGB", (16, 32)))}},
        "frames": {"type": "frames/from-images",
                   "inputs": {"image": wire("a", "image"), "image2": wire("b", "image")}},
        "out": {"type": "image/save-animated-webp", "inputs": {"frames": wire("frames", "frames")}},
    }
    outcome, _ = render(nodes, "out")
    assert outcome.status == "failed"
    assert outcome.error is not None and outcome.error["nodeId"] == "frames"
    assert "16x32, 32x32" in outcome.error["message"]


def test_frames_batch_joins_clips_and_images_in_order_at_the_first_ones_size(make_ctx):
    """frames/batch (ComfyUI's BatchImagesNode): a clip, an image (one frame) and a clip of
    another size (cut to the first's aspect over its centre, then stretched bilinear)."""
    from workers.runners import RUNNERS
    from workers.runners.image_ops import centre_crop_box, resized

    first, other = smooth_frames(count=3), smooth_frames(count=2, width=96, height=48)
    still = Image.fromarray(smooth_frames(count=1)[0][::-1].copy())
    out = RUNNERS["frames/batch"](make_ctx(), {}, {"frames": Frames(first), "frames2": still,
                                                   "frames3": Frames(other)})["frames"]
    assert out.array.shape == (6, H, W, 3)
    assert np.array_equal(out.array[:3], first) and np.array_equal(out.array[3], np.asarray(still))
    wide = Image.fromarray(other[1])
    expected = resized(wide.crop(centre_crop_box(96, 48, W / H)), W, H, "bilinear")
    assert np.array_equal(out.array[5], np.asarray(expected))
