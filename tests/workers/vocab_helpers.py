"""Runs a graph through the real executor in this process, on the real database (rolled back):
validate → Run row → claim → `execute` → `run_finish`, as a worker slot does, without Celery.
For the graph-vocabulary tests (values, switches, previews, save formats)."""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib.auth import get_user_model

from apps.graphs.models import Graph
from apps.graphs.schema import GraphDoc
from apps.graphs.validation import graph_validate
from apps.runs.models import Run, RunEvent
from apps.runs.services import run_claim, run_finish
from workers.executor import CancelCheck, Outcome, execute
from workers.nodecache import NodeCache


def wire(node: str, port: str) -> dict[str, str]:
    return {"node": node, "port": port}


def render(nodes: dict[str, Any], target: str, *, cache: NodeCache | None = None
           ) -> tuple[Outcome, Run]:
    """Execute `nodes` up to `target` as one attempt and record it; (the outcome, the run)."""
    from workers.device.policy import DevicePolicy

    doc = graph_validate(GraphDoc.model_validate({"nodes": nodes}), target=target)
    owner, _ = get_user_model().objects.get_or_create(username="vocab-owner")
    graph, _ = Graph.objects.get_or_create(sha256=doc.sha256(),
                                           defaults={"document": doc.model_dump()})
    run = Run.objects.create(owner=owner, graph=graph, target=target, queue="vocab-test")
    claim = run_claim(run_id=str(run.pk), worker=f"vocab@test#{uuid.uuid4().hex[:6]}")
    assert claim is not None
    outcome = execute(claim, cache=cache if cache is not None else NodeCache(64 << 20),
                      policy=DevicePolicy(profile="cpu"), cancel=CancelCheck(claim))
    assert run_finish(claim=claim, status=outcome.status, error=outcome.error,
                      events=outcome.events, takes=outcome.takes, values=outcome.values)
    run.refresh_from_db()
    return outcome, run


def done_nodes(run: Run) -> list[str]:
    """The node ids of the run's node_done events, in order."""
    return [e.payload["nodeId"] for e in RunEvent.objects.filter(run=run, type="node_done")
            .order_by("seq")]


def take_image(run: Run) -> Any:
    """The run's one take, as an RGB PIL image."""
    import io

    from PIL import Image

    from apps.takes.storage import blob_read

    [take] = run.takes.all()
    return Image.open(io.BytesIO(blob_read(take.sha256))).convert("RGB")


def asset_of(image: Any) -> str:
    """The id of an uploaded asset holding `image` (a PIL image) as PNG."""
    import io

    from apps.takes.services import asset_create

    owner, _ = get_user_model().objects.get_or_create(username="vocab-owner")
    out = io.BytesIO()
    image.save(out, format="PNG")
    asset, _ = asset_create(owner=owner, data=out.getvalue())
    return str(asset.pk)


def assert_mp4_with_sound(run: Run, *, side: int, fps: float, frames: int) -> None:
    """The run's one take: a side² MP4 of `frames` frames at `fps`, with a sound track."""
    import io

    import av

    from apps.takes.storage import blob_read

    [take] = run.takes.all()
    with av.open(io.BytesIO(blob_read(take.sha256)), "r") as mp4:
        stream = mp4.streams.video[0]
        assert (stream.width, stream.height, float(stream.average_rate or 0)) == (side, side, fps)
        assert len(list(mp4.decode(stream))) == frames
    with av.open(io.BytesIO(blob_read(take.sha256)), "r") as mp4:
        assert mp4.streams.audio, "the clip has its sound track"


SOUND_CODECS = {"mp3": ("mp3", "mp3"), "wav": ("wav", "pcm_s16le"), "flac": ("flac", "flac"),
                "ogg": ("ogg", "libopus"), "m4a": ("ipod", "aac")}  # format → (muxer, codec)


def sound_file(fmt: str, seconds: float = 1.0, rate: int = 48000) -> bytes:
    """A sound file of `fmt` (SOUND_CODECS) made with PyAV: a stereo 440 / 660 Hz tone."""
    import io
    from fractions import Fraction

    import av
    import numpy as np

    muxer, codec = SOUND_CODECS[fmt]
    t = np.arange(int(seconds * rate)) / rate
    wave = (0.4 * np.stack([np.sin(2 * np.pi * 440 * t), np.sin(2 * np.pi * 660 * t)])
            ).astype(np.float32)
    out = io.BytesIO()
    with av.open(out, "w", format=muxer) as container:
        stream: Any = container.add_stream(codec, rate=rate)  # an audio stream (typed as any)
        stream.layout = "stereo"
        size = stream.codec_context.frame_size or 1024
        for start in range(0, wave.shape[1], size):
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(wave[:, start:start + size]),
                                               format="fltp", layout="stereo")
            frame.sample_rate, frame.pts = rate, start
            frame.time_base = Fraction(1, rate)
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return out.getvalue()


def sound_asset_of(fmt: str = "mp3", seconds: float = 1.0) -> str:
    """The id of an uploaded sound file asset (`sound_file`)."""
    from apps.takes.services import asset_create

    owner, _ = get_user_model().objects.get_or_create(username="vocab-owner")
    asset, _ = asset_create(owner=owner, data=sound_file(fmt, seconds))
    return str(asset.pk)


def cut_resolution_selector(workflow: dict[str, Any], clip: dict[str, Any]) -> None:
    """A shipped template's ResolutionSelector (0.1 megapixels at the least) cut away, its links
    into the subgraph instance `clip` unwired: the subgraph's own width and height widgets then
    give the (tiny) size."""
    selector = next(n for n in workflow["nodes"] if n["type"] == "ResolutionSelector")
    cut = {link[0] for link in workflow["links"] if link[1] == selector["id"]}
    workflow["links"] = [link for link in workflow["links"] if link[0] not in cut]
    workflow["nodes"].remove(selector)
    for port in clip["inputs"]:
        port["link"] = None if port.get("link") in cut else port.get("link")
