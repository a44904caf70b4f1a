"""FLUX.1 Kontext's image editing nodes. `flux1/reference`: a prompt's conditioning gains a
reference image as a reference latent (FluxKontextPipeline's `image`), sized as the pipeline
sizes it, which the transformer attends to beside the image it denoises;
`flux1/reference-latent`: the same from a latent already encoded (ComfyUI's ReferenceLatent after
FluxKontextImageScale and a VAEEncode). Registered with the family (FAMILY.nodes)."""

from __future__ import annotations

from typing import Any

from workers.device.thread import on_device_thread
from workers.models.flux2.edit import with_references
from workers.models.values import Conditioning, Latent, Vae
from workers.runners.base import NodeContext, NodeFailed, runner
from workers.runners.diffusion import checked, expect

FAMILY = "flux1"


@runner("flux1/reference")
def flux1_reference(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    """`conditioning` with `image` appended to its references, encoded by `vae` as
    FluxKontextPipeline encodes its image (engine.encode_reference)."""
    from PIL import Image

    from workers.models.flux1 import engine

    conditioning = _flux1_prompt(inputs)
    vae = expect(inputs, "vae", Vae)
    if vae.family != FAMILY:
        raise NodeFailed(f"input 'vae' is {vae.name}'s ({vae.family}); reference images "
                         "condition FLUX.1 prompts with FLUX.1's VAE")
    image = inputs.get("image")
    if not isinstance(image, Image.Image) or image.mode != "RGB":
        raise NodeFailed("the reference image must be an RGB image")
    latent = checked(lambda: on_device_thread(engine.encode_reference, vae, image))
    return {"conditioning": with_references(conditioning, [latent])}


@runner("flux1/reference-latent")
def flux1_reference_latent(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    """`conditioning` with `latent` (FLUX.1's [1, 16, h, w], e.g. a `vae/encode` of the
    reference image) appended to its references."""
    from workers.models.flux1 import LATENT

    conditioning = _flux1_prompt(inputs)
    latent = expect(inputs, "latent", Latent)
    samples = latent.samples
    if latent.empty or samples.ndim != 4 or samples.shape[1] != LATENT.channels \
            or samples.shape[-2] % 2 or samples.shape[-1] % 2:
        raise NodeFailed(f"input 'latent' must be a FLUX.1 latent [1, {LATENT.channels}, h, w] "
                         f"with even sides (a FLUX.1 VAE's encode of an image in multiples of "
                         f"16 px), got {tuple(samples.shape)}")
    return {"conditioning": with_references(conditioning, [samples])}


def _flux1_prompt(inputs: dict[str, Any]) -> Conditioning:
    conditioning = expect(inputs, "conditioning", Conditioning)
    if conditioning.encoder.family != FAMILY:
        raise NodeFailed(f"input 'conditioning' is {conditioning.encoder.name}'s "
                         f"({conditioning.encoder.family}); FLUX.1 Kontext's references "
                         "condition FLUX.1 prompts")
    return conditioning
