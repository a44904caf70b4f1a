"""Runners of the video nodes (apps/graphs/nodes_video.py): frames from images, a clip from
frames and sound, a clip's parts, an uploaded clip, and the video takes (encoded by the executor
through workers/video.py once the node returns)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from workers.models.values import Frames, Video
from workers.runners.base import NodeContext, NodeFailed, runner

# A clip's frames are held decoded in memory ([F, H, W, 3] uint8): a node that would make more
# than this fails, naming the size, instead of exhausting the worker.
MAX_CLIP_BYTES = 4 << 30


@runner("frames/from-images")
def frames_from_images(ctx: NodeContext, params: dict[str, Any],
                       inputs: dict[str, Any]) -> dict[str, Any]:
    names = ["image", *(f"image{i}" for i in range(2, 9))]
    images = [inputs[n].convert("RGB") for n in names if inputs.get(n) is not None]
    sizes = {im.size for im in images}
    if len(sizes) > 1:
        raise NodeFailed("the images differ in size: "
                         + ", ".join(f"{w}x{h}" for w, h in sorted(sizes)))
    width, height = images[0].size
    _check_budget(len(images) * params["hold"], width, height)
    array = np.stack([np.asarray(im, np.uint8) for im in images])  # [N, H, W, 3]
    return {"frames": Frames(np.repeat(array, params["hold"], axis=0))}


@runner("frames/batch")
def frames_batch(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
    """Each input's frames (an image: one frame) in input order, each resized to the first's
    size as ComfyUI's batch_images does (its crop 'center', then bilinear)."""
    from PIL import Image

    from apps.graphs.nodes_video import MAX_BATCHED
    from workers.runners.image_ops import centre_crop_box, resized

    names = ["frames", *(f"frames{i}" for i in range(2, MAX_BATCHED + 1))]
    parts = [inputs[n] for n in names if inputs.get(n) is not None]
    arrays = [p.array if isinstance(p, Frames) else np.asarray(p.convert("RGB"), np.uint8)[None]
              for p in parts]
    height, width = arrays[0].shape[1:3]
    _check_budget(sum(len(a) for a in arrays), width, height)

    def fitted(frame: Any) -> Any:
        image = Image.fromarray(frame, "RGB")
        image = image.crop(centre_crop_box(image.width, image.height, width / height))
        return np.asarray(resized(image, width, height, "bilinear"), np.uint8)

    return {"frames": Frames(np.concatenate([
        a if a.shape[1:3] == (height, width) else np.stack([fitted(f) for f in a])
        for a in arrays]))}


def _check_budget(frames: int, width: int, height: int) -> None:
    if frames * width * height * 3 > MAX_CLIP_BYTES:
        raise NodeFailed(f"{frames} frames of {width}x{height} exceed the "
                         f"{MAX_CLIP_BYTES >> 30} GiB a clip may hold in memory")


@runner("video/create")
def video_create(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
    return {"video": Video(inputs["frames"], float(params["fps"]), inputs.get("audio"))}


@runner("video/components")
def video_components(ctx: NodeContext, params: dict[str, Any],
                     inputs: dict[str, Any]) -> dict[str, Any]:
    video: Video = inputs["video"]
    return {"frames": video.frames, "audio": video.audio, "fps": float(video.fps)}


def asset_file(asset_id: str, media: str, what: str) -> tuple[Any, Path]:
    """(the asset, the path of its bytes) of an uploaded `media` asset (video, audio); a node
    error naming it when it is gone, another media (not `what`) or its bytes are missing."""
    from apps.takes.models import Asset
    from apps.takes.storage import blob_path

    asset = Asset.objects.filter(pk=asset_id).first()
    if asset is None:
        raise NodeFailed(f"asset {asset_id} no longer exists")
    if not asset.media_type.startswith(f"{media}/"):
        raise NodeFailed(f"asset {asset.pk} is {asset.media_type}, not {what}")
    path = blob_path(asset.sha256)
    if not path.exists():
        raise NodeFailed(f"the bytes of asset {asset.pk} are missing from {path.parent.parent}")
    return asset, path


@runner("video/load")
def video_load(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
    from workers.video import video_read

    asset, path = asset_file(params["asset"], "video", "a video (MP4 or WebM)")
    try:
        return {"video": video_read(str(path), max_bytes=MAX_CLIP_BYTES)}
    except ValueError as exc:
        raise NodeFailed(f"asset {asset.pk}: {exc}") from None


@runner("video/save")
def video_save(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
    video: Video = inputs["video"]
    if video.frames.width % 2 or video.frames.height % 2:
        raise NodeFailed(f"a {video.frames.width}x{video.frames.height} clip cannot be kept as "
                         f"{params['format']}: H.264 and VP9 in 4:2:0 need even sides")
    if params["format"] == "mp4" and params["crf"] > 51:
        raise NodeFailed(f"crf {params['crf']}: H.264 (mp4) takes 0-51; VP9 (webm) takes 0-63")
    ctx.keep_video_take(video, format=params["format"], crf=params["crf"], label=params["label"])
    return {}


@runner("image/save-animated-webp")
def save_animated_webp(ctx: NodeContext, params: dict[str, Any],
                       inputs: dict[str, Any]) -> dict[str, Any]:
    ctx.keep_video_take(Video(inputs["frames"], float(params["fps"])), format="webp-animated",
                        quality=params["quality"], lossless=params["lossless"],
                        label=params["label"])
    return {}
