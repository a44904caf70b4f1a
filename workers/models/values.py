"""The values that flow between the diffusion nodes (model, vae, text-encoder, conditioning,
latent ports), whatever the family. Images between nodes are PIL RGB images.

Every loaded value names the `family` whose plug-in loaded it (workers/models/families.py): the
generic nodes ask that family's plug-in for its schedule, encode and decode."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from workers.device.policy import Placement

Tensor = Any  # torch.Tensor


@dataclass(frozen=True, eq=False)
class DiffusionModel:
    """`model` port: a loaded denoiser (transformer or UNet) and the step batcher that owns it."""

    name: str  # the file name in diffusion_models/
    sha256: str
    transformer: Any  # e.g. diffusers.ZImageTransformer2DModel, on placement.device
    batcher: Any  # workers.sampling.StepBatcher
    placement: Placement
    family: str = ""  # the plug-in that loaded it (workers/models/families.py)


@dataclass(frozen=True, eq=False)
class Vae:
    """`vae` port: a loaded AutoencoderKL (its family says the latent format)."""

    name: str
    sha256: str
    module: Any  # diffusers.AutoencoderKL
    placement: Placement
    # workers.sampling.Coalescer of latents -> images: decodes that arrive together share a call
    batched: Any = field(default=None, repr=False)
    family: str = ""  # the plug-in that loaded it (workers/models/families.py)


@dataclass(frozen=True, eq=False)
class TextEncoder:
    """`text-encoder` port: a text encoder (or a family's pair of them) and its tokenizer."""

    name: str
    sha256: str
    model: Any  # e.g. transformers.Qwen3Model
    tokenizer: Any
    placement: Placement
    # workers.sampling.Coalescer of text -> embeds: encodes that arrive together share a call
    batched: Any = field(default=None, repr=False)
    family: str = ""  # the plug-in that loaded it (workers/models/families.py)


@dataclass(frozen=True, eq=False)
class Conditioning:
    """`conditioning` port: one prompt's embeddings in its family's form (Z-Image: caption
    embeddings [L, D], padding dropped).

    `encoder` is kept so a sampler can encode the empty negative prompt when guidance > 0 and
    no negative conditioning is wired (what the diffusers pipeline does).
    """

    embeds: Any  # the family's form: Z-Image [L, D], on the text encoder's dtype and device
    text: str
    encoder: TextEncoder


@dataclass(frozen=True, eq=False)
class Latent:
    """`latent` port: [1, C, H/d, W/d] float32 in a family's (scaled, shifted) latent space,
    d = `downscale` (the family's latent format: Z-Image 16 channels at ÷8).

    `empty` marks a latent from `latent/empty`: only its pixel size matters (a sampler makes its
    own family's latents of that size).
    """

    samples: Tensor
    empty: bool = False
    downscale: int = 8

    @property
    def pixel_size(self) -> tuple[int, int]:
        """(width, height) in pixels."""
        return self.samples.shape[-1] * self.downscale, self.samples.shape[-2] * self.downscale


@dataclass(frozen=True, eq=False)
class Mask:
    """`mask` port: a float32 plane [H, W] in 0..1, where 1 marks the area to paint (ComfyUI's
    MASK convention). Images stay Pillow images; a mask needs more than 8 bits (feathering)."""

    values: Any  # numpy.ndarray [H, W] float32

    @property
    def width(self) -> int:
        return int(self.values.shape[1])

    @property
    def height(self) -> int:
        return int(self.values.shape[0])

    @property
    def nbytes(self) -> int:  # the node cache's size of it (workers/nodecache.py)
        return int(self.values.nbytes)
