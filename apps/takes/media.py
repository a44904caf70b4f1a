"""Video and sound uploads and posters, read with PyAV (FFmpeg in its wheel; no torch): what an
uploaded clip or sound file is, and the still picture that stands for a take in lists (a clip's
first frame)."""

from __future__ import annotations

import io
import logging
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

VIDEO_UPLOADS = {"mp4": "video/mp4", "webm": "video/webm"}  # muxer name → media type
# muxer name → media type of a sound file (ComfyUI's LoadAudio: mp3, wav, flac, ogg / opus, m4a)
AUDIO_UPLOADS = {"mp3": "audio/mpeg", "wav": "audio/wav", "flac": "audio/flac",
                 "ogg": "audio/ogg", "m4a": "audio/mp4"}
log = logging.getLogger(__name__)

POSTER_SIDE = 512  # an image take's poster: scaled to fit this square


@dataclass(frozen=True)
class ClipInfo:
    media_type: str
    width: int
    height: int


def looks_like_video(data: bytes) -> bool:
    """An ISO media file (MP4: an `ftyp` box first) or a Matroska / WebM one (the EBML magic)."""
    return data[4:8] == b"ftyp" or data[:4] == b"\x1a\x45\xdf\xa3"


def looks_like_audio(data: bytes) -> bool:
    """An MP3 (an ID3 tag or an MPEG audio frame sync), WAV (RIFF … WAVE), FLAC or Ogg file;
    an M4A starts as an MP4 does (`looks_like_video`)."""
    return (data[:3] == b"ID3" or (len(data) > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0)
            or (data[:4] == b"RIFF" and data[8:12] == b"WAVE")
            or data[:4] in (b"fLaC", b"OggS"))


def sound_inspect(data: bytes) -> str | None:
    """The media type of a sound file (AUDIO_UPLOADS) that holds a decodable audio stream and
    no video; None for anything else."""
    import av

    try:
        with av.open(io.BytesIO(data), "r") as sound:
            muxers = set(sound.format.name.split(","))
            if sound.streams.video or not sound.streams.audio:
                return None
            next(sound.decode(sound.streams.audio[0]))  # a frame decodes, not just a header
            kind = next((k for k in AUDIO_UPLOADS if k in muxers), None)
            return AUDIO_UPLOADS[kind] if kind else None
    except (av.FFmpegError, StopIteration, ValueError, OSError):
        return None


def clip_inspect(data: bytes) -> ClipInfo | None:
    """The media type and picture size of an MP4 or WebM clip; None when it is not one that
    holds a decodable video stream."""
    import av

    try:
        with av.open(io.BytesIO(data), "r") as clip:
            muxers = set(clip.format.name.split(","))
            if not clip.streams.video:
                return None
            stream = clip.streams.video[0]
            next(clip.decode(stream))  # the first frame decodes: not just a plausible header
            kind = "mp4" if "mp4" in muxers else "webm" if "webm" in muxers else None
            if kind is None:
                return None
            return ClipInfo(VIDEO_UPLOADS[kind], stream.codec_context.width,
                            stream.codec_context.height)
    except (av.FFmpegError, StopIteration, ValueError, OSError):
        return None


def poster_png(path: Path, media_type: str) -> bytes:
    """A PNG that stands for the take stored at `path`: a clip's first frame, or an image scaled
    to fit POSTER_SIDE (the first frame of an animated WebP). Bytes that do not decode (a damaged
    blob, a clip without a picture) get a grey "no preview" card rather than an error, so one bad
    take never breaks a list of thumbnails."""
    import av

    try:
        image = _first_picture(path, media_type)
    except (av.FFmpegError, StopIteration, ValueError, OSError):  # PIL's errors are OSErrors
        log.warning("take at %s (%s) has no decodable picture; its poster is a card",
                    path.name, media_type)
        image = _no_preview_card()
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def _first_picture(path: Path, media_type: str) -> Image.Image:
    if media_type.startswith("video/"):
        import av

        with av.open(str(path), "r") as clip:
            return next(clip.decode(video=0)).to_image()
    with Image.open(path) as source:
        source.seek(0)
        image = source.convert("RGBA" if "A" in source.getbands() else "RGB")
    image.thumbnail((POSTER_SIDE, POSTER_SIDE))
    return image


def _no_preview_card() -> Image.Image:
    from PIL import ImageDraw

    card = Image.new("RGB", (POSTER_SIDE // 2, POSTER_SIDE // 4), (58, 58, 64))
    ImageDraw.Draw(card).text((12, POSTER_SIDE // 8 - 6), "no preview", fill=(200, 200, 205))
    return card
