"""The `flux2/reference` node: FLUX.2's image editing. A prompt's conditioning gains 1–3
reference images as reference latents (the pipelines' `image` argument; ComfyUI's
ReferenceLatent), which the transformer attends to beside the image it denoises. Registered
with the family (FAMILY.nodes)."""

from __future__ import annotations

from typing import Any

from workers.device.thread import on_device_thread
from workers.models.values import Conditioning, Vae
from workers.runners.base import NodeContext, NodeFailed, runner
from workers.runners.diffusion import checked, expect

FAMILY = "flux2"
IMAGE_PORTS = ("image", "image_2", "image_3")
MAX_REFERENCES = 3  # what the node takes at once; chain nodes for more


@runner("flux2/reference")
def flux2_reference(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    """`conditioning` with the wired images appended to its references, in port order, each
    encoded by `vae` as the pipelines encode theirs (engine.encode_reference)."""
    from PIL import Image

    from workers.models.flux2 import engine

    conditioning = expect(inputs, "conditioning", Conditioning)
    vae = expect(inputs, "vae", Vae)
    for value, what in ((conditioning.encoder, "conditioning"), (vae, "vae")):
        if value.family != FAMILY:
            raise NodeFailed(f"input {what!r} is {value.name}'s ({value.family}); reference "
                             f"images condition FLUX.2 prompts with FLUX.2's VAE")
    images = [inputs[port] for port in IMAGE_PORTS if inputs.get(port) is not None]
    for image in images:
        if not isinstance(image, Image.Image) or image.mode != "RGB":
            raise NodeFailed("reference images must be RGB images")

    def encoded(image: Any) -> Any:
        return checked(lambda: on_device_thread(engine.encode_reference, vae, image))

    latents = [encoded(image) for image in images]
    prompt = conditioning.embeds
    embeds = prompt._replace(references=(*prompt.references, *latents))
    return {"conditioning": Conditioning(embeds, conditioning.text, conditioning.encoder)}
