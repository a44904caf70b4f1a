"""Video takes: frames (+ audio) → MP4 (H.264 + AAC) or WebM (VP9 + Opus) with PyAV, streamed to
a file; animated WebP through Pillow; and an uploaded clip decoded back into frames and audio.

Takes are content-addressed, so the same frames must give the same bytes on every run and every
worker: the muxer and the encoders run with FFmpeg's `bitexact` flags (no encoder version string,
no creation time), one encoder thread, and RGB → YUV 4:2:0 is done here in integer numpy (BT.601
limited range) rather than by swscale, whose SIMD paths may differ between CPUs.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np

from workers.models.values import Audio, Frames, Video

CONTAINERS = {  # format → (muxer, video codec, audio codec, media type)
    "mp4": ("mp4", "libx264", "aac", "video/mp4"),
    "webm": ("webm", "libvpx-vp9", "libopus", "video/webm"),
}
AUDIO_RATES = {"mp4": None, "webm": 48000}  # Opus encodes 48 kHz only; AAC keeps the source's
AAC_LOWEST, AAC_LOW = 7350, 8000  # AAC's lowest rate; a sound below it is resampled to 8 kHz
_BITEXACT = {"flags": "+bitexact"}


@dataclass(frozen=True)
class VideoFacts:
    """What a video take's row and wire shape say about it."""

    media_type: str
    width: int
    height: int
    frame_count: int
    fps: float
    duration_seconds: float
    audio_seconds: float | None


def video_write(video: Video, path: Path, *, format: str, crf: int, comment: str) -> VideoFacts:
    """Encode `video` into `path` as `format` ("mp4" or "webm") at `crf` (0 = best), with
    `comment` (the take's lineage) in the container's metadata. The packets go to the file as
    they are made: the clip is never held in memory as bytes."""
    muxer, vcodec, acodec, media_type = CONTAINERS[format]
    frames = video.frames.array  # [F, H, W, 3] uint8
    _check_even(frames)
    rate = _rate(video.fps)
    with av.open(str(path), "w", format=muxer, options={"fflags": "+bitexact"},
                 container_options=_container_options(format)) as out:
        out.metadata["comment"] = comment
        vstream = _video_stream(out, vcodec, rate, frames, crf)
        astream = _audio_stream(out, acodec, video.audio, AUDIO_RATES[format]) \
            if video.audio is not None else None
        for index, rgb in enumerate(frames):
            frame = _yuv420_frame(rgb)
            frame.pts = index
            out.mux(vstream.encode(frame))
        out.mux(vstream.encode(None))
        if astream is not None and video.audio is not None:
            _encode_audio(out, astream, video.audio)
    return VideoFacts(
        media_type=media_type, width=video.frames.width, height=video.frames.height,
        frame_count=video.frames.count, fps=float(video.fps),
        duration_seconds=round(video.frames.count / float(video.fps), 6),
        audio_seconds=round(video.audio.seconds, 6) if video.audio is not None else None,
    )


def clip_encode(video: Video, path: Path, *, format: str, crf: int, quality: int, lossless: bool,
                comment: str) -> VideoFacts:
    """`video` into `path` as a take's bytes: mp4 / webm (`video_write`) or webp-animated."""
    if format in CONTAINERS:
        return video_write(video, path, format=format, crf=crf, comment=comment)
    if format != "webp-animated":
        raise ValueError(f"no encoder for clip format {format!r}")
    path.write_bytes(webp_animated(video.frames, video.fps, quality=quality, lossless=lossless,
                                   text=comment))
    frames = video.frames
    return VideoFacts(media_type="image/webp", width=frames.width, height=frames.height,
                      frame_count=frames.count, fps=float(video.fps),
                      duration_seconds=round(frames.count / float(video.fps), 6),
                      audio_seconds=None)


def _container_options(format: str) -> dict[str, str]:
    # mp4: the moov atom first so a browser plays the take before it has every byte
    return {"movflags": "+faststart"} if format == "mp4" else {}


def _check_even(frames: Any) -> None:
    if frames.shape[1] % 2 or frames.shape[2] % 2:
        raise ValueError(f"a {frames.shape[2]}x{frames.shape[1]} clip cannot be encoded as "
                         "YUV 4:2:0: both sides must be even")


def _rate(fps: float) -> Fraction:
    return Fraction(fps).limit_denominator(1001)


def _video_stream(out: Any, codec: str, rate: Fraction, frames: Any, crf: int) -> Any:
    stream = out.add_stream(codec, rate=rate)
    stream.width, stream.height = int(frames.shape[2]), int(frames.shape[1])
    stream.pix_fmt = "yuv420p"
    stream.time_base = 1 / rate
    stream.codec_context.flags |= av.codec.context.Flags.bitexact
    stream.thread_count = 1
    options = {"crf": str(crf)}
    if codec == "libx264":
        options |= {"preset": "medium", "threads": "1"}
    else:
        options |= {"b": "0", "deadline": "good", "cpu-used": "4", "row-mt": "0", "threads": "1"}
        if crf == 0:
            options["lossless"] = "1"
    stream.options = options
    return stream


def _audio_stream(out: Any, codec: str, audio: Audio, rate: int | None) -> Any:
    rate = rate or audio.sample_rate
    stream = out.add_stream(codec, rate=AAC_LOW if codec == "aac" and rate < AAC_LOWEST else rate)
    stream.layout = "mono" if audio.samples.shape[0] == 1 else "stereo"
    stream.codec_context.flags |= av.codec.context.Flags.bitexact
    stream.thread_count = 1
    return stream


def _encode_audio(out: Any, stream: Any, audio: Audio) -> None:
    samples = np.ascontiguousarray(np.clip(audio.samples[:2], -1.0, 1.0), dtype=np.float32)
    layout = "mono" if samples.shape[0] == 1 else "stereo"
    resampler = av.AudioResampler(format=stream.format.name, layout=layout, rate=stream.rate)
    frame_size = stream.codec_context.frame_size or 1024
    pts = 0
    for start in range(0, samples.shape[1], frame_size * 8):
        chunk = samples[:, start:start + frame_size * 8]
        frame = av.AudioFrame.from_ndarray(chunk, format="fltp", layout=layout)
        frame.sample_rate, frame.pts = audio.sample_rate, start
        frame.time_base = Fraction(1, audio.sample_rate)
        for resampled in resampler.resample(frame):
            resampled.pts = pts
            pts += resampled.samples
            out.mux(stream.encode(resampled))
    for resampled in resampler.resample(None):
        resampled.pts = pts
        pts += resampled.samples
        out.mux(stream.encode(resampled))
    out.mux(stream.encode(None))


def _yuv420_frame(rgb: Any) -> Any:
    """One [H, W, 3] uint8 RGB frame as a yuv420p VideoFrame (BT.601, limited range)."""
    r, g, b = (rgb[..., i].astype(np.int32) for i in range(3))
    y = ((66 * r + 129 * g + 25 * b + 128) >> 8) + 16
    u = ((-38 * r - 74 * g + 112 * b + 128) >> 8) + 128
    v = ((112 * r - 94 * g - 18 * b + 128) >> 8) + 128
    h, w = y.shape

    def half(plane: Any) -> Any:  # the mean of each 2×2 block, rounded
        s = plane[0::2, 0::2] + plane[1::2, 0::2] + plane[0::2, 1::2] + plane[1::2, 1::2]
        return (s + 2) >> 2

    planes = np.concatenate([y.reshape(-1), half(u).reshape(-1), half(v).reshape(-1)])
    buf = np.clip(planes, 0, 255).astype(np.uint8).reshape(h * 3 // 2, w)
    return av.VideoFrame.from_ndarray(buf, format="yuv420p")


def webp_animated(frames: Frames, fps: float, *, quality: int, lossless: bool, text: str) -> bytes:
    """`frames` as an animated WebP that loops, each frame shown 1/fps s (whole milliseconds)."""
    from PIL import Image

    images = [Image.fromarray(f) for f in frames.array]
    out = io.BytesIO()
    xmp = f'<x:xmpmeta xmlns:x="adobe:ns:meta/"><inline-farm>{_escape(text)}</inline-farm>' \
          "</x:xmpmeta>"
    images[0].save(out, format="WEBP", save_all=True, append_images=images[1:],
                   duration=max(1, round(1000 / fps)), loop=0, quality=quality,
                   lossless=lossless, method=4, xmp=xmp.encode())
    return out.getvalue()


def video_read(path_or_file: Any, *, max_bytes: int) -> Video:
    """Decode a clip (an uploaded MP4 / WebM) into RGB frames, its frame rate and its sound
    (float32, the first two channels). ValueError when it holds no video stream, or when its
    decoded frames would take more than `max_bytes`."""
    with av.open(path_or_file) as clip:
        if not clip.streams.video:
            raise ValueError("the file holds no video stream")
        vstream = clip.streams.video[0]
        fps = float(vstream.average_rate or vstream.guessed_rate or 30)
        rgb: list[Any] = []
        held = 0
        for frame in clip.decode(vstream):
            held += frame.width * frame.height * 3
            if held > max_bytes:
                raise ValueError(f"its {frame.width}x{frame.height} frames decoded exceed "
                                 f"{max_bytes >> 20} MiB after {len(rgb)} frames")
            rgb.append(frame.to_ndarray(format="rgb24"))
    audio = audio_read(path_or_file)
    return Video(Frames(np.stack(rgb)), fps, audio)


def audio_read(path_or_file: Any, max_bytes: int | None = None) -> Audio | None:
    """The first sound track of a file (a clip, a sound file) as float32 samples (its first two
    channels) at its own rate; None when it has none. Past `max_bytes` of samples: a ValueError
    while decoding (before the memory is spent)."""
    if hasattr(path_or_file, "seek"):
        path_or_file.seek(0)
    with av.open(path_or_file) as clip:
        if not clip.streams.audio:
            return None
        stream = clip.streams.audio[0]
        rate = stream.rate
        channels = min(2, stream.channels)
        resampler = av.AudioResampler(format="fltp", layout="mono" if channels == 1 else "stereo",
                                      rate=rate)
        chunks: list[np.ndarray] = []
        held = 0
        for frame in [*clip.decode(stream), None]:
            for out in resampler.resample(frame):
                chunks.append(out.to_ndarray())
                held += chunks[-1].nbytes
                if max_bytes is not None and held > max_bytes:
                    raise ValueError(f"the sound decodes to more than {max_bytes >> 20} MiB")
    if not chunks:
        return None
    return Audio(np.concatenate(chunks, axis=1).astype(np.float32), int(rate))


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")

