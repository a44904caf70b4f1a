"""Sound nodes: an uploaded sound file decoded, and a stretch of it cut out. Runners:
workers/runners/audio.py. `audio` is a sound track: float32 samples [channels, n] at a sample
rate (workers/models/values.py `Audio`)."""

from __future__ import annotations

from apps.graphs.descriptors import NodeDescriptor, Param, Port

MAX_SECONDS = 3600.0  # a trim's start and duration (ComfyUI's are unbounded)

AUDIO = (
    NodeDescriptor(
        "audio/load", "Load audio", "audio",
        outputs=(Port("audio", "audio"),),
        params=(Param("asset", "asset", required=True, media="audio",
                      description="An uploaded sound file's asset id (MP3, WAV, FLAC, Ogg / "
                      "Opus or M4A)."),),
        description="An uploaded sound file, decoded at its own sample rate (its first two "
        "channels; ComfyUI's LoadAudio).",
    ),
    NodeDescriptor(
        "audio/trim", "Trim audio", "audio",
        inputs=(Port("audio", "audio"),
                Port("start", "float", required=False, accepts=("int",)),
                Port("duration", "float", required=False, accepts=("int",))),
        outputs=(Port("audio", "audio"),),
        params=(Param("start", "float", 0.0, min=-MAX_SECONDS, max=MAX_SECONDS, input="start",
                      description="Where the stretch starts, in seconds (negative: counted "
                      "from the end)."),
                Param("duration", "float", 60.0, min=0.0, max=MAX_SECONDS, input="duration",
                      description="How long the stretch lasts, in seconds (cut at the "
                      "sound's end).")),
        description="A stretch of a sound track (ComfyUI's TrimAudioDuration): from `start` "
        "for `duration` seconds, within the sound.",
    ),
)
