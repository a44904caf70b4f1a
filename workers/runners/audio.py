"""Runners of the sound nodes (apps/graphs/nodes_audio.py): an uploaded sound file decoded, and
a stretch of a sound track."""

from __future__ import annotations

from typing import Any

from workers.models.values import Audio
from workers.runners.base import NodeContext, NodeFailed, runner

MAX_AUDIO_BYTES = 1 << 30  # a decoded sound held in memory: about 45 min of 48 kHz stereo


@runner("audio/load")
def audio_load(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
    """The asset's sound (ComfyUI's LoadAudio): float32 samples at the file's own rate."""
    import av

    from workers.runners.video import asset_file
    from workers.video import audio_read

    asset, path = asset_file(params["asset"], "audio", "a sound file")
    try:
        audio = audio_read(str(path), max_bytes=MAX_AUDIO_BYTES)
    except (av.FFmpegError, ValueError, OSError) as exc:
        raise NodeFailed(f"asset {asset.pk} does not decode as sound: {exc}") from None
    if audio is None:
        raise NodeFailed(f"asset {asset.pk} holds no sound track")
    return {"audio": audio}


def trimmed(audio: Audio, start: float, duration: float) -> Audio:
    """`duration` seconds of `audio` from `start` (negative: from the end), as ComfyUI's
    TrimAudioDuration cuts them: sample indices rounded, clamped to the sound."""
    n, rate = audio.samples.shape[-1], audio.sample_rate
    first = round(start * rate) + (n if start < 0 else 0)
    first = max(0, min(first, n - 1))
    last = max(0, min(first + round(duration * rate), n))
    if first >= last:
        raise NodeFailed(f"nothing to keep: start {start} s and duration {duration} s fall "
                         f"outside the sound's {audio.seconds:.3f} s")
    return Audio(audio.samples[:, first:last].copy(), rate)


@runner("audio/trim")
def audio_trim(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
    audio = inputs["audio"]
    if not isinstance(audio, Audio):
        raise NodeFailed("input 'audio' must be a sound track (audio/load)")
    start = float(inputs.get("start", params["start"]))
    duration = float(inputs.get("duration", params["duration"]))
    if duration < 0:
        raise NodeFailed(f"duration must be 0 s or more, got {duration}")
    return {"audio": trimmed(audio, start, duration)}
