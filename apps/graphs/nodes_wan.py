"""The video nodes of the Wan family (workers/models/wan/nodes.py runs them): a video latent,
its decode into frames, a still out of frames, and Wan's image-to-video conditioning."""

from __future__ import annotations

from apps.graphs.descriptors import NodeDescriptor, Param, Port
from apps.graphs.nodes_image import MAX_SIDE

MAX_FRAMES = 1025  # frames of one clip (1 + 4k; Wan renders 81 at 16 fps)
_width = Param("width", "int", 832, min=16, max=MAX_SIDE, multiple_of=16, input="width",
               description="Frame width in pixels (a multiple of 16).")
_height = Param("height", "int", 480, min=16, max=MAX_SIDE, multiple_of=16, input="height",
                description="Frame height in pixels (a multiple of 16).")
_length = Param("length", "int", 81, min=1, max=MAX_FRAMES, input="length",
                description="Frames of the clip: 1 + 4k (the VAE packs 4 frames per latent "
                "frame after the first).")
_batch = Param("batch", "int", 1, min=1, max=1,
               description="Clips per latent: one (submit several runs: they share forwards).")
_sizes = tuple(Port(name, "int", required=False) for name in ("width", "height", "length"))

WAN = (
    NodeDescriptor(
        "latent/empty-video", "Empty video latent", "latent",
        inputs=_sizes,
        outputs=(Port("latent", "latent"),),
        params=(_width, _height, _length, _batch),
        description="Zeros of a clip's size, [1, 16, (length − 1)/4 + 1, H/8, W/8] (ComfyUI's "
        "EmptyHunyuanLatentVideo); a video model's sampler starts from its noise, in its own "
        "latents (TI2V-5B: 48 channels at H/16, W/16; sides of 32).",
    ),
    NodeDescriptor(
        "vae/decode-video", "VAE decode (video)", "latent",
        inputs=(Port("vae", "vae"), Port("latent", "latent")),
        outputs=(Port("frames", "frames"),),
        description="The frames of a video latent, decoded by a video VAE (Wan's).",
    ),
    NodeDescriptor(
        "frames/image", "Frame of a clip", "image",
        inputs=(Port("frames", "frames"), Port("index", "int", required=False)),
        outputs=(Port("image", "image"),),
        params=(Param("index", "int", 0, min=-MAX_FRAMES, max=MAX_FRAMES - 1, input="index",
                      description="The frame (0: the first; −1: the last)."),),
        description="One frame of a clip as an image (to save a still, or feed an image node).",
    ),
    NodeDescriptor(
        "wan/image-to-video", "Wan image to video", "conditioning",
        inputs=(Port("positive", "conditioning"), Port("negative", "conditioning", required=False),
                Port("vae", "vae"), Port("start_image", "image"),
                Port("end_image", "image", required=False), *_sizes),
        outputs=(Port("positive", "conditioning"), Port("negative", "conditioning",
                                                          passes="negative"),
                 Port("latent", "latent")),
        params=(_width, _height, _length, _batch),
        description="Wan image-to-video (ComfyUI's WanImageToVideo; with an end image "
        "WanFirstLastFrameToVideo): the prompts conditioned on the start (and end) frame, "
        "encoded as WanImageToVideoPipeline does (mask + encoded condition video: the 36-"
        "channel transformer's extra input), and the clip's empty latent. Images are resized "
        "to the clip's size.",
    ),
    NodeDescriptor(
        "wan/ti2v-latent", "Wan 2.2 TI2V latent", "latent",
        inputs=(Port("vae", "vae"), Port("start_image", "image", required=False), *_sizes),
        outputs=(Port("latent", "latent"),),
        params=(Param("width", "int", 1280, min=32, max=MAX_SIDE, multiple_of=32, input="width",
                      description="Frame width in pixels (a multiple of 32)."),
                Param("height", "int", 704, min=32, max=MAX_SIDE, multiple_of=32,
                      input="height", description="Frame height in pixels (a multiple of 32)."),
                Param("length", "int", 121, min=1, max=MAX_FRAMES, input="length",
                      description=_length.description), _batch),
        description="Wan 2.2 TI2V-5B's clip latent (ComfyUI's Wan22ImageToVideoLatent): "
        "[1, 48, (length − 1)/4 + 1, H/16, W/16] for the Wan 2.2 VAE; empty for text to video, "
        "or with a start image its encoded frame first, kept while the sampler denoises the "
        "rest (that frame's tokens at timestep 0, as WanImageToVideoPipeline with "
        "expand_timesteps). The image is resized to the clip's size.",
    ),
)
