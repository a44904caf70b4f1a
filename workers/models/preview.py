"""Live sampling previews: a small RGB image of the denoiser's current estimate, no VAE decode.

A latent-to-RGB linear map is fitted once per loaded VAE, from the VAE itself: a few synthetic
colour fields are encoded and the latent channels regressed onto the images' 8x-downsampled
pixels (least squares). A preview is then one [16 → 3] projection of the step's x0 estimate
(x0 = x − σ·v for flow matching), at latent resolution (1/8 of the image side): a 1024² render
previews at 128². It never touches the job's tensors, so it cannot change the result.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from workers.models.values import Vae

_FITS: weakref.WeakKeyDictionary[Vae, tuple[torch.Tensor, torch.Tensor]] = weakref.WeakKeyDictionary()
FIT_IMAGES, FIT_SIDE, FIT_BLOCKS = 8, 64, 4


@torch.no_grad()
def latent_rgb_fit(vae: Vae) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [C, 3], bias [3]) mapping a scaled latent pixel to RGB in [-1, 1]; cached."""
    if vae in _FITS:
        return _FITS[vae]
    generator = torch.Generator("cpu").manual_seed(0)
    blocks = torch.rand(FIT_IMAGES, 3, FIT_BLOCKS, FIT_BLOCKS, generator=generator) * 2 - 1
    images = torch.nn.functional.interpolate(blocks, size=(FIT_SIDE, FIT_SIDE), mode="bilinear")
    pixels = images.to(device=vae.placement.device, dtype=vae.module.dtype)
    latents = _scaled_latents(vae.module, pixels)
    target = torch.nn.functional.avg_pool2d(images, 8)  # [N, 3, 8, 8], the latent grid
    x = latents.float().cpu().permute(0, 2, 3, 1).reshape(-1, latents.shape[1])  # [N·64, 16]
    x = torch.cat([x, torch.ones(len(x), 1)], dim=1)  # bias column
    y = target.permute(0, 2, 3, 1).reshape(-1, 3)  # [N·64, 3]
    solution = torch.linalg.lstsq(x, y).solution  # [17, 3]
    _FITS[vae] = (solution[:-1], solution[-1])
    return _FITS[vae]


def _scaled_latents(module: Any, pixels: torch.Tensor) -> torch.Tensor:
    """The sampler's latents [N, C, h, w] of images [N, 3, H, W]: a 3-D video VAE (Wan's,
    with per-channel `latents_mean` / `latents_std`) encodes them as one-frame clips."""
    cfg = module.config
    if cfg.get("latents_mean") is not None:
        latents = module.encode(pixels.unsqueeze(2)).latent_dist.mode()[:, :, 0]  # [N, C, h, w]
        mean = torch.tensor(cfg.latents_mean).view(1, -1, 1, 1).to(latents)
        std = torch.tensor(cfg.latents_std).view(1, -1, 1, 1).to(latents)
        return (latents - mean) / std
    shift = cfg.get("shift_factor") or 0.0  # Flux-geometry VAEs shift; SDXL's does not
    return (module.encode(pixels).latent_dist.mode() - shift) * cfg.scaling_factor


@torch.no_grad()
def preview_pixels(vae: Vae, latents: torch.Tensor, sigma: Any, velocity: torch.Tensor) -> Any:
    """The x0 estimate of `latents` [1, 16, h, w] at `sigma` with `velocity`, as RGB pixels
    (uint8 numpy [h, w, 3]): the device's part of a preview (workers/runners/diffusion.py
    encodes it off the device thread, `preview_png`). A clip's latents [1, 16, F', h, w]
    preview as one small frame: the middle one."""
    if latents.ndim == 5:
        middle = latents.shape[2] // 2
        latents, velocity = latents[:, :, middle], velocity[:, :, middle]
    weights, bias = latent_rgb_fit(vae)
    x0 = (latents.float() - float(sigma) * velocity.float())[0].cpu()  # [16, h, w]
    rgb = torch.einsum("chw,ck->hwk", x0, weights) + bias  # [h, w, 3] in ~[-1, 1]
    return ((rgb.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).numpy()


def preview_png(pixels: Any) -> bytes:
    """`preview_pixels`' pixels as a PNG (the takes' encoder, workers/png.py)."""
    from PIL import Image

    from workers.png import png_encode

    return png_encode(Image.fromarray(pixels, "RGB"))
