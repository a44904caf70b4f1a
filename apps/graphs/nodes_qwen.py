"""Qwen-Image nodes beyond the prompt encoders of apps/graphs/nodes.py: Qwen-Image 2.1's
prompt node (workers/models/qwenimage21/nodes.py runs it) and the reference latent of a
Qwen-Image-Edit prompt (workers/models/qwenimage/edit.py)."""

from __future__ import annotations

from apps.graphs.descriptors import NodeDescriptor, Param, Port

MAX_PROMPT = 32000  # as apps/graphs/nodes.py (a circular import otherwise)
QWEN21_IMAGES = 16  # the condition images one qwenimage21/encode takes (ComfyUI's image_1…16)
QWEN21_IMAGE_PORTS = tuple(f"image_{i}" for i in range(1, QWEN21_IMAGES + 1))
REFERENCE_METHODS = ("auto", "index", "index_timestep_zero")  # qwenimage/reference-latent's

QWEN = (
    NodeDescriptor(
        "qwenimage21/encode", "Qwen-Image 2.1 prompt", "conditioning",
        inputs=(
            Port("encoder", "text-encoder"),
            Port("vae", "vae", required=False),
            *(Port(port, "image", required=False) for port in QWEN21_IMAGE_PORTS),
            Port("text", "text", required=False),
            Port("negative_text", "text", required=False),
        ),
        outputs=(Port("positive", "conditioning"), Port("negative", "conditioning"),
                 Port("latent", "latent")),
        params=(
            Param("text", "string", "", input="text", max_length=MAX_PROMPT),
            Param("negative_text", "string", "", input="negative_text", max_length=MAX_PROMPT),
            Param("resolution", "int", 1024, min=0, max=4096, multiple_of=32,
                  description="Condition images are resized to about resolution² px at their "
                  "aspect ratio, sides of 32 (0: each keeps its own size, rounded to sides of "
                  "32); the latent has the first image's size (no image: resolution × "
                  "resolution, 1024 × 1024 at 0)."),
        ),
        description="Qwen-Image 2.1 (ComfyUI's TextEncodeQwenImage21): the prompt and the "
        "negative prompt encoded by the Qwen3-VL with 0–16 condition images, each also VAE-"
        "encoded as a reference latent (QwenImage21Pipeline's image mode; images need the "
        "VAE), and the empty latent to sample.",
    ),
    NodeDescriptor(
        "qwenimage/reference-latent", "Qwen-Image reference latent", "conditioning",
        inputs=(Port("conditioning", "conditioning"), Port("latent", "latent", required=False)),
        outputs=(Port("conditioning", "conditioning"),),
        params=(
            Param("method", "enum", "auto", choices=REFERENCE_METHODS,
                  description="How the transformer reads the prompt's reference latents "
                  "(ComfyUI's FluxKontextMultiReferenceLatentMethod): index_timestep_zero: at "
                  "timestep 0 (Qwen-Image-Edit-2511); index: at the image's timestep (2509); "
                  "auto: as the transformer's config says (`zero_cond_t`, or ComfyUI's "
                  "`__index_timestep_zero__` marker in its file). Each reference at its own "
                  "index, in both."),
        ),
        description="Qwen-Image-Edit from an encoded reference (ComfyUI's ReferenceLatent after "
        "a VAEEncode): the latent appended to the prompt's reference latents as is; the "
        "transformer reads it beside the image it denoises. Chain it for more references. "
        "Without a latent it only sets the prompt's `method`.",
    ),
)
