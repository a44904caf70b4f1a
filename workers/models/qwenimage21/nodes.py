"""Qwen-Image 2.1's prompt node, `qwenimage21/encode` (ComfyUI's TextEncodeQwenImage21): the
prompt and the negative prompt encoded by the Qwen3-VL with 0–16 condition images (the engine's
`encode_with_images`, QwenImage21Pipeline's image mode: each image also VAE-encoded as a
reference latent; `resolution` 0 keeps each image's own size, rounded to sides of 32), and the
empty latent to sample at the first image's size. Registered with
the family (FAMILY.nodes); the descriptor is apps/graphs/nodes_qwen.py's."""

from __future__ import annotations

from typing import Any

from apps.graphs.nodes_qwen import QWEN21_IMAGE_PORTS
from workers.device.thread import on_device_thread
from workers.models.values import Conditioning, Latent, TextEncoder, Vae
from workers.runners.base import NodeContext, NodeFailed, runner
from workers.runners.diffusion import checked, expect

FAMILY = "qwenimage21"


@runner("qwenimage21/encode")
def qwenimage21_encode(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    """positive, negative (each with the wired images, port order) and the empty latent."""
    import torch

    from workers.models.qwenimage21 import LATENT
    from workers.models.qwenimage21.engine import (
        OUTPUT_RESOLUTION,
        condition_size,
        encode_prompts,
        encode_with_images,
    )

    encoder = expect(inputs, "encoder", TextEncoder)
    if encoder.family != FAMILY:
        raise NodeFailed(f"input 'encoder' is {encoder.name} ({encoder.family}); Qwen-Image 2.1 "
                         "encodes with its Qwen3-VL")
    images = _images(inputs)
    vae = inputs.get("vae")
    if images and (not isinstance(vae, Vae) or vae.family != FAMILY):
        raise NodeFailed("condition images need input 'vae' wired to Qwen-Image 2.1's VAE (the "
                         "transformer reads them as its reference latents)")
    resolution = int(params.get("resolution", 1024))
    texts = [str(inputs.get(port, params[port])) for port in ("text", "negative_text")]

    def encoded() -> list[Any]:
        if not images or not isinstance(vae, Vae):
            return encode_prompts(encoder, texts)
        return [encode_with_images(encoder, vae, text, images, resolution) for text in texts]

    positive, negative = checked(lambda: on_device_thread(encoded))
    # ComfyUI's latent: the first image's size, else resolution² (resolution 0: the default)
    width, height = (condition_size(resolution, *images[0].size) if images
                     else (resolution or OUTPUT_RESOLUTION,) * 2)
    latent = torch.zeros(1, LATENT.channels, height // LATENT.downscale, width // LATENT.downscale)
    return {"positive": Conditioning(positive, texts[0], encoder),
            "negative": Conditioning(negative, texts[1], encoder),
            "latent": Latent(latent, empty=True, downscale=LATENT.downscale)}


def _images(inputs: dict[str, Any]) -> list[Any]:
    from PIL import Image

    images = [inputs[port] for port in QWEN21_IMAGE_PORTS if inputs.get(port) is not None]
    for image in images:
        if not isinstance(image, Image.Image) or image.mode not in ("RGB", "RGBA"):
            raise NodeFailed("condition images must be RGB or RGBA images")
    return images
