"""The farm's node vocabulary: every node type a graph may use, declared once."""

from __future__ import annotations

from dataclasses import replace

from apps.graphs.descriptors import NodeDescriptor, Param, Port
from apps.graphs.nodes_image import IMAGE_OPS, MAX_SIDE
from apps.graphs.nodes_logic import SWITCHES, VALUES

MAX_SEED = 2**53 - 1  # the largest integer a JSON client (JavaScript) holds exactly
SAVE_FORMATS = {"png": "image/png", "webp": "image/webp", "jpeg": "image/jpeg"}
MAX_PROMPT = 8000  # characters of a prompt or any text fed to the text encoder
MAX_LABEL = 200  # characters of a take's label (copied into every take and run listing)

_width = Param("width", "int", 1024, min=16, max=MAX_SIDE, multiple_of=16,
               description="Image width in pixels (a multiple of 16).")
_height = Param("height", "int", 1024, min=16, max=MAX_SIDE, multiple_of=16,
                description="Image height in pixels (a multiple of 16).")


def _wired(param: Param) -> Param:
    """`param`, suppliable by the input port of its name (an upstream int: ComfyUI's widget
    input); a value that arrives is checked against the param's limits when the node runs."""
    return replace(param, input=param.name)


_seed = Param("seed", "int", 0, min=0, max=MAX_SEED, input="seed",
              description="Noise seed; the same seed gives the same image.")
_steps = Param("steps", "int", 8, min=1, max=100, description="Denoising steps.")
_guidance = Param("guidance", "float", 0.0, min=0.0, max=20.0,
                  description="Classifier-free guidance scale; 0 disables CFG (Turbo default).")
PARALLEL_CHOICES = ("auto", "off", "2", "4", "8")
_parallel = Param("parallel", "enum", "auto", choices=PARALLEL_CHOICES,
                  description="Split one image's denoise over a multi-GPU worker group: a group "
                  "size (\"2\": the xfuser.2 queue), \"off\" (one GPU), or \"auto\" (a group "
                  "only when no single live GPU can hold the run).")

SOURCES = (
    NodeDescriptor(
        "input/text", "Text", "input",
        outputs=(Port("text", "text"),),
        params=(Param("value", "string", "", max_length=MAX_PROMPT, description="The text."),),
    ),
    NodeDescriptor(
        "input/int", "Integer", "input",
        outputs=(Port("value", "int"),),
        params=(Param("value", "int", 0, min=-MAX_SEED, max=MAX_SEED),),
    ),
    NodeDescriptor(
        "input/float", "Number", "input",
        outputs=(Port("value", "float"),),
        params=(Param("value", "float", 0.0),),
    ),
    NodeDescriptor(
        "input/image", "Input image", "input",
        outputs=(Port("image", "image"),),
        params=(Param("asset", "asset", required=True, description="An uploaded asset id."),),
    ),
)

IMAGE = (
    NodeDescriptor(
        "image/load", "Load image", "image",
        outputs=(Port("image", "image"), Port("mask", "mask")),
        params=(Param("asset", "asset", required=True, description="An uploaded asset id."),),
        description="An uploaded image, and its mask as ComfyUI's LoadImage gives it: 1 − alpha "
        "(an image without alpha: a 64×64 mask of zeros).",
    ),
    NodeDescriptor(
        "image/crop", "Crop image", "image",
        inputs=(Port("image", "image"), *(Port(side, "int", required=False)
                                          for side in ("x", "y", "width", "height"))),
        outputs=(Port("image", "image"),),
        params=(
            Param("x", "int", 0, min=0, max=MAX_SIDE * 2, input="x"),
            Param("y", "int", 0, min=0, max=MAX_SIDE * 2, input="y"),
            Param("width", "int", required=True, min=1, max=MAX_SIDE * 2, input="width"),
            Param("height", "int", required=True, min=1, max=MAX_SIDE * 2, input="height"),
        ),
    ),
    NodeDescriptor(
        "image/save", "Save take", "output",
        inputs=(Port("image", "image"),),
        params=(Param("label", "string", "", max_length=MAX_LABEL,
                      description="A free label kept with the take."),
                Param("format", "enum", "png", choices=tuple(SAVE_FORMATS),
                      description="The take's file format (its bytes' content type)."),
                Param("quality", "int", 90, min=1, max=100,
                      description="WebP / JPEG quality (PNG is lossless and ignores it).")),
        produces_takes=True,
        description="Keeps its input as an immutable take (PNG, WebP or JPEG).",
    ),
    NodeDescriptor(
        "util/delay", "Delay (diagnostic)", "util",
        inputs=(Port("image", "image"),),
        outputs=(Port("image", "image"),),
        params=(Param("seconds", "float", 1.0, min=0.0, max=600.0),),
        hidden=True,
        description="Passes its image through after a pause, checking cancellation; for "
        "exercising leases, cancellation and failover on a live farm.",
    ),
)

MODELS = (
    NodeDescriptor(
        "load/diffusion-model", "Load diffusion model", "loaders",
        outputs=(Port("model", "model"),),
        params=(Param("file", "model", required=True, options_from="diffusion_models"),),
    ),
    NodeDescriptor(
        "load/vae", "Load VAE", "loaders",
        outputs=(Port("vae", "vae"),),
        params=(Param("file", "model", required=True, options_from="vae"),),
    ),
    NodeDescriptor(
        "load/text-encoder", "Load text encoder", "loaders",
        outputs=(Port("encoder", "text-encoder"),),
        params=(Param("file", "model", required=True, options_from="text_encoders"),
                Param("file_2", "model", options_from="text_encoders",
                      description="A family's second text encoder (FLUX.1: CLIP-L and T5, "
                      "in either order).")),
    ),
    NodeDescriptor(
        "encode/text", "Encode text", "conditioning",
        inputs=(Port("encoder", "text-encoder"), Port("text", "text", required=False)),
        outputs=(Port("conditioning", "conditioning"),),
        params=(Param("text", "string", "", input="text", max_length=MAX_PROMPT),),
    ),
    NodeDescriptor(
        "latent/empty", "Empty latent", "latent",
        inputs=(Port("width", "int", required=False), Port("height", "int", required=False)),
        outputs=(Port("latent", "latent"),),
        params=(_wired(_width), _wired(_height)),
    ),
    NodeDescriptor(
        "sample", "Sample", "sampling",
        inputs=(
            Port("model", "model"),
            Port("positive", "conditioning"),
            Port("negative", "conditioning", required=False),
            Port("latent", "latent"),
            Port("seed", "int", required=False),
        ),
        outputs=(Port("latent", "latent"),),
        params=(
            _seed, _steps, _guidance,
            Param("denoise", "float", 1.0, min=0.0, max=1.0,
                  description="1.0 starts from noise; less keeps part of the input latent."),
            _parallel,
        ),
    ),
    NodeDescriptor(
        "vae/decode", "VAE decode", "latent",
        inputs=(Port("vae", "vae"), Port("latent", "latent")),
        outputs=(Port("image", "image"),),
    ),
    NodeDescriptor(
        "vae/encode", "VAE encode", "latent",
        inputs=(Port("vae", "vae"), Port("image", "image")),
        outputs=(Port("latent", "latent"),),
    ),
    NodeDescriptor(
        "zimage/turbo", "Z-Image Turbo", "generate",
        inputs=(
            Port("image", "image", required=False),
            Port("prompt", "text", required=False),
            Port("seed", "int", required=False),
        ),
        outputs=(Port("image", "image"),),
        params=(
            Param("prompt", "string", "", input="prompt", max_length=MAX_PROMPT),
            Param("negative_prompt", "string", "", max_length=MAX_PROMPT),
            _width, _height,
            Param("steps", "int", 8, min=1, max=100),
            _guidance, _seed,
            Param("strength", "float", 0.6, min=0.0, max=1.0,
                  description="img2img only: how much of the init image is re-noised."),
            Param("model", "model", required=True, options_from="diffusion_models",
                  family="zimage"),
            Param("vae", "model", required=True, options_from="vae", family="zimage"),
            Param("text_encoder", "model", required=True, options_from="text_encoders",
                  family="zimage"),
            _parallel,
        ),
        description="Text-to-image (or img2img with an input image) with Z-Image Turbo.",
    ),
)

ALL_NODES: tuple[NodeDescriptor, ...] = SOURCES + IMAGE + IMAGE_OPS + VALUES + SWITCHES + MODELS
