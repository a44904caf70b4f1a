"""The values that flow between the diffusion nodes (model, vae, text-encoder, conditioning,
latent ports). Images between nodes are PIL RGB images."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from workers.device.policy import Placement

Tensor = Any  # torch.Tensor


@dataclass(frozen=True, eq=False)
class DiffusionModel:
    """`model` port: a loaded Z-Image transformer and the step batcher that owns it."""

    name: str  # the file name in diffusion_models/
    sha256: str
    transformer: Any  # diffusers.ZImageTransformer2DModel, on placement.device
    batcher: Any  # workers.sampling.StepBatcher
    placement: Placement


@dataclass(frozen=True, eq=False)
class Vae:
    """`vae` port: a loaded Flux-geometry AutoencoderKL (16 latent channels, ÷8)."""

    name: str
    sha256: str
    module: Any  # diffusers.AutoencoderKL
    placement: Placement
    # workers.sampling.Coalescer of latents -> images: decodes that arrive together share a call
    batched: Any = field(default=None, repr=False)


@dataclass(frozen=True, eq=False)
class TextEncoder:
    """`text-encoder` port: a Qwen3Model and its tokenizer (with a chat template)."""

    name: str
    sha256: str
    model: Any  # transformers.Qwen3Model
    tokenizer: Any
    placement: Placement
    # workers.sampling.Coalescer of text -> embeds: encodes that arrive together share a call
    batched: Any = field(default=None, repr=False)


@dataclass(frozen=True, eq=False)
class Conditioning:
    """`conditioning` port: one prompt's caption embeddings [L, D] (padding dropped).

    `encoder` is kept so a sampler can encode the empty negative prompt when guidance > 0 and
    no negative conditioning is wired (what the diffusers pipeline does).
    """

    embeds: Tensor  # [L, D], the text encoder's dtype and device
    text: str
    encoder: TextEncoder


@dataclass(frozen=True, eq=False)
class Latent:
    """`latent` port: [1, 16, H/8, W/8] float32 in the model's (scaled, shifted) latent space.

    `empty` marks a latent from `latent/empty`: only its shape matters.
    """

    samples: Tensor
    empty: bool = False

    @property
    def pixel_size(self) -> tuple[int, int]:
        """(width, height) in pixels."""
        return self.samples.shape[-1] * 8, self.samples.shape[-2] * 8
