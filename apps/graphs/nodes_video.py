"""Video nodes: frames and sound into a clip, a clip back into its parts, and clips (or frames)
kept as takes (MP4 H.264 + AAC, WebM VP9 + Opus, animated WebP). Runners: workers/runners/video.py.

`frames` are a clip's decoded pictures ([F, H, W, 3] uint8), `audio` a sound track, `video` the
two at a frame rate (workers/models/values.py).
"""

from __future__ import annotations

from apps.graphs.descriptors import NodeDescriptor, Param, Port

MAX_LABEL = 200  # as image/save's label
MAX_FPS = 240.0
MAX_HOLD = 600
MAX_BATCHED = 16  # inputs of frames/batch
VIDEO_FORMATS = {"mp4": "video/mp4", "webm": "video/webm"}
_label = Param("label", "string", "", max_length=MAX_LABEL,
               description="A free label kept with the take.")
_fps = Param("fps", "float", 30.0, min=1.0, max=MAX_FPS, input="fps",
             description="Frames per second (an upstream float may supply it: a clip's own).")

VIDEO = (
    NodeDescriptor(
        "frames/from-images", "Frames from images", "video",
        inputs=(Port("image", "image"), *(Port(f"image{i}", "image", required=False)
                                          for i in range(2, 9))),
        outputs=(Port("frames", "frames"),),
        params=(Param("hold", "int", 1, min=1, max=MAX_HOLD,
                      description="How many frames each image is shown for."),),
        description="Images of one size, in input order (image, image2 … image8), as a clip's "
        "frames (ComfyUI's image batch).",
    ),
    NodeDescriptor(
        "frames/batch", "Batch frames", "video",
        inputs=tuple(Port("frames" if i == 1 else f"frames{i}", "frames", required=i == 1,
                          accepts=("image",)) for i in range(1, MAX_BATCHED + 1)),
        outputs=(Port("frames", "frames"),),
        description="Clips' frames (or single images) one after another, in input order "
        "(frames, frames2 … frames16): ComfyUI's BatchImagesNode. Each is first stretched to "
        "the first one's size over its centre (bilinear, ComfyUI's crop 'center').",
    ),
    NodeDescriptor(
        "video/create", "Create video", "video",
        inputs=(Port("frames", "frames"), Port("audio", "audio", required=False),
                Port("fps", "float", required=False, accepts=("int",))),
        outputs=(Port("video", "video"),),
        params=(_fps,),
        description="Frames at a frame rate, with a sound track when one is wired (ComfyUI's "
        "CreateVideo).",
    ),
    NodeDescriptor(
        "video/components", "Video components", "video",
        inputs=(Port("video", "video"),),
        outputs=(Port("frames", "frames"), Port("audio", "audio"), Port("fps", "float")),
        description="A clip's frames, sound track and frame rate (ComfyUI's "
        "GetVideoComponents); a clip without sound gives no audio.",
    ),
    NodeDescriptor(
        "video/load", "Load video", "video",
        outputs=(Port("video", "video"),),
        params=(Param("asset", "asset", required=True, media="video",
                      description="An uploaded video asset id (MP4 or WebM)."),),
        description="An uploaded clip, decoded: frames, frame rate and sound (ComfyUI's "
        "LoadVideo).",
    ),
    NodeDescriptor(
        "video/save", "Save video take", "output",
        inputs=(Port("video", "video"),),
        params=(
            _label,
            Param("format", "enum", "mp4", choices=tuple(VIDEO_FORMATS),
                  description="mp4: H.264 video + AAC sound; webm: VP9 video + Opus sound."),
            Param("crf", "int", 19, min=0, max=63,
                  description="Constant rate factor: 0 is the best quality (H.264 takes 0-51, "
                  "VP9 0-63)."),
        ),
        produces_takes=True,
        description="Keeps the clip as an immutable video take (ComfyUI's SaveVideo); the same "
        "frames give the same bytes.",
    ),
    NodeDescriptor(
        "image/save-animated-webp", "Save animated WebP", "output",
        inputs=(Port("frames", "frames"),),
        params=(
            _label,
            Param("fps", "float", 6.0, min=0.01, max=MAX_FPS, description="Frames per second."),
            Param("lossless", "bool", True, description="ComfyUI's default; off: lossy at `quality`."),
            Param("quality", "int", 80, min=0, max=100),
        ),
        produces_takes=True,
        description="Keeps the frames as a looping animated WebP take (ComfyUI's "
        "SaveAnimatedWEBP).",
    ),
)
