"""FLUX.1's own node: `flux1/inpaint` (ComfyUI's InpaintModelConditioning for FLUX.1 Fill). The
prompts gain `fill`, the Fill transformer's condition (engine.fill_condition), which the sampler
passes on to its jobs; the latent is the image's, with the mask as its noise mask. Registered
with the family (FAMILY.nodes)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from workers.device.thread import on_device_thread
from workers.models.flux1 import LATENT
from workers.models.values import Conditioning, Latent, Mask, Vae
from workers.runners.base import NodeContext, NodeFailed, runner
from workers.runners.diffusion import checked, expect

FAMILY = "flux1"


@runner("flux1/inpaint")
def flux1_inpaint(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    """The prompts with the image's Fill condition, and the image's latent (its posterior's
    mode), masked by `mask` resized to the latent (ComfyUI's noise mask) unless `noise_mask`
    is off. The mask is first resized to the image, and both cut to the 16-pixel grid."""
    import torch
    from PIL import Image

    from workers.models.flux1.engine import encode_image, fill_condition

    vae = expect(inputs, "vae", Vae)
    if vae.module.config.latent_channels != LATENT.channels:
        raise NodeFailed(f"input 'vae' is {vae.name}, not FLUX.1's 16-channel VAE")
    image = expect(inputs, "image", Image.Image).convert("RGB")
    image, mask = on_grid(image, pixel_mask(expect(inputs, "mask", Mask), *image.size))
    fill = checked(lambda: on_device_thread(fill_condition, vae, image, mask))
    samples = checked(lambda: on_device_thread(encode_image, vae, image)).cpu()
    noise_mask = None
    if params.get("noise_mask", True):
        noise_mask = torch.nn.functional.interpolate(mask[None, None], size=samples.shape[-2:],
                                                     mode="bilinear")  # [1, 1, h, w]
    out: dict[str, Any] = {
        "positive": _with_fill(expect(inputs, "positive", Conditioning), fill, "positive"),
        "latent": Latent(samples, downscale=LATENT.downscale, mask=noise_mask),
    }
    if inputs.get("negative") is not None:
        out["negative"] = _with_fill(expect(inputs, "negative", Conditioning), fill, "negative")
    return out


def on_grid(image: Any, mask: Any) -> tuple[Any, Any]:
    """The image and its mask [H, W] cut to their centre on FLUX.1's 16-pixel grid (ComfyUI's
    InpaintModelConditioning cuts to the VAE's 8 and its model pads to the 2×2 patches; here one
    cut does both)."""
    m = LATENT.pixel_multiple
    width, height = image.width // m * m, image.height // m * m
    if not width or not height:
        raise NodeFailed(f"input 'image' is {image.width}×{image.height}: FLUX.1 inpaints "
                         f"images of at least {m}×{m}")
    if (width, height) == image.size:
        return image, mask
    left, top = (image.width % m) // 2, (image.height % m) // 2
    return (image.crop((left, top, left + width, top + height)),
            mask[top:top + height, left:left + width])


def pixel_mask(mask: Mask, width: int, height: int) -> Any:
    """The mask [H, W] float32 at the image's size (ComfyUI's bilinear resize)."""
    import torch

    values = torch.from_numpy(mask.values).float()
    if (mask.width, mask.height) == (width, height):
        return values
    return torch.nn.functional.interpolate(values[None, None], size=(height, width),
                                           mode="bilinear")[0, 0]


def _with_fill(conditioning: Conditioning, fill: Any, port: str) -> Conditioning:
    if conditioning.encoder.family != FAMILY:
        raise NodeFailed(f"input {port!r} was encoded by {conditioning.encoder.name} "
                         f"({conditioning.encoder.family}); flux1/inpaint conditions FLUX.1 "
                         "prompts")
    return replace(conditioning, extra={**conditioning.extra, "fill": fill})
