"""FLUX.2's image editing nodes. `flux2/reference`: a prompt's conditioning gains 1–3
reference images as reference latents (the pipelines' `image` argument), which the transformer
attends to beside the image it denoises; `flux2/reference-latent`: the same from a latent
already encoded (ComfyUI's ReferenceLatent after a VAEEncode). Registered with the family
(FAMILY.nodes)."""

from __future__ import annotations

from typing import Any

from workers.device.thread import on_device_thread
from workers.models.values import Conditioning, Latent, Vae
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
    return {"conditioning": with_references(conditioning, latents)}


@runner("flux2/reference-latent")
def flux2_reference_latent(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    """`conditioning` with `latent` (FLUX.2's [1, 128, h, w], e.g. a `vae/encode` of the
    reference image) appended to its references."""
    from workers.models.flux2 import LATENT

    conditioning = expect(inputs, "conditioning", Conditioning)
    latent = expect(inputs, "latent", Latent)
    if conditioning.encoder.family != FAMILY:
        raise NodeFailed(f"input 'conditioning' is {conditioning.encoder.name}'s "
                         f"({conditioning.encoder.family}); reference latents condition FLUX.2 "
                         "prompts")
    samples = latent.samples
    if latent.empty or samples.ndim != 4 or samples.shape[1] != LATENT.channels:
        raise NodeFailed(f"input 'latent' must be a FLUX.2 latent [1, {LATENT.channels}, h, w] "
                         f"(a FLUX.2 VAE's encode), got {tuple(samples.shape)}")
    return {"conditioning": with_references(conditioning, [samples])}


def with_references(conditioning: Conditioning, latents: list[Any]) -> Conditioning:
    """`conditioning` with `latents` appended to its prompt's `references` (FLUX.2's and
    FLUX.1 Kontext's prompts alike)."""
    prompt = conditioning.embeds
    embeds = prompt._replace(references=(*prompt.references, *latents))
    return Conditioning(embeds, conditioning.text, conditioning.encoder)
