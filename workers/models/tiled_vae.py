"""Tiled VAE decode and encode that give the untiled result (ComfyUI's VAEDecodeTiled /
VAEEncodeTiled, `vae/decode-tiled` / `vae/encode-tiled`).

Why not diffusers' `enable_tiling` (or ComfyUI's tiles): each tile there normalises with its own
GroupNorm statistics and attends only within itself, so tiles disagree at their seams and the
image is not the untiled one (up to 80 levels apart on the tiny random VAE, measured). Here:

- Only the full-resolution end of the network is tiled, where the memory goes: the decoder's
  last up block and its output layers; the encoder's input layer and first down block. The rest
  (the mid block's attention, the low-resolution blocks) runs whole, as untiled.
- Each tile is computed with `overlap` pixels of context around its own part, at least the
  tiled layers' reach (`reach`: 7 pixels for the decoder's last up block and output conv), so
  convolutions see what they see untiled; only its own part is kept.
- A GroupNorm's statistics are the whole image's: for each GroupNorm of the tiled part, in
  order, one pass over the tiles sums its input over their own parts (the norms before it
  already using whole-image statistics), then the next. The cost is that many partial passes
  over the tiled layers (about 3× their work for the decoder); the memory is one tile's.

For diffusers' 2-D `AutoencoderKL`-style VAEs (an `Encoder` and a `Decoder` of
diffusers.models.autoencoders.vae): Z-Image, FLUX.1, SDXL. Others are refused by name.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from fractions import Fraction
from typing import Any

import torch
from torch import nn

# The decoder's last up blocks run in tiles: the full-resolution one and the one that upsamples
# to it (where the memory goes); the blocks before them and the mid block run whole.
TILED_UP_BLOCKS = 2


class NotTileable(Exception):
    """This VAE has no diffusers 2-D Encoder/Decoder to tile."""


class TiledAutoencoder:
    """`module` (an AutoencoderKL) whose `decode` / `encode` run in tiles of `tile` pixels with
    `overlap` pixels of context; everything else is the module's (a family's decode and encode
    functions take it in the module's place)."""

    def __init__(self, module: Any, tile: int, overlap: int) -> None:
        from diffusers.models.autoencoders.vae import Decoder, Encoder

        if not (isinstance(getattr(module, "decoder", None), Decoder)
                and isinstance(getattr(module, "encoder", None), Encoder)):
            raise NotTileable(f"{type(module).__name__} is not a 2-D AutoencoderKL-style VAE")
        self._module, self.tile, self.overlap = module, tile, overlap

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)

    @torch.no_grad()
    def decode(self, z: torch.Tensor, return_dict: bool = False) -> Any:
        from diffusers.models.autoencoders.vae import DecoderOutput

        m = self._module
        if m.post_quant_conv is not None:
            z = m.post_quant_conv(z)
        d = m.decoder
        x = d.mid_block(d.conv_in(z), None)
        blocks = list(d.up_blocks)
        tiled = blocks[-TILED_UP_BLOCKS:]
        for block in blocks[:-TILED_UP_BLOCKS]:
            x = block(x, None)

        def tail(t: torch.Tensor) -> torch.Tensor:
            for block in tiled:
                t = block(t, None)
            return d.conv_out(d.conv_act(d.conv_norm_out(t)))

        parts = [*tiled, d.conv_out]
        up = 2 ** sum(1 for block in tiled if block.upsamplers)  # image pixels per input pixel
        out = _tiled(tail, x, [*_norms_of(*tiled), d.conv_norm_out],
                     tile=-(-self.tile // up), halo=max(-(-self.overlap // up), reach(*parts)))
        return DecoderOutput(sample=out) if return_dict else (out,)

    @torch.no_grad()
    def encode(self, x: torch.Tensor, return_dict: bool = True) -> Any:
        from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution
        from diffusers.models.modeling_outputs import AutoencoderKLOutput

        m = self._module
        e = m.encoder
        first, *rest = e.down_blocks

        def head(t: torch.Tensor) -> torch.Tensor:
            return first(e.conv_in(t))

        step = 2 if first.downsamplers else 1  # tiles start on the downsampler's grid
        h = _tiled(head, x, _norms_of(first), tile=_multiple(self.tile, step),
                   halo=_multiple(max(self.overlap, reach(e.conv_in, first)), step))
        for block in rest:
            h = block(h)
        h = e.conv_out(e.conv_act(e.conv_norm_out(e.mid_block(h))))
        if m.quant_conv is not None:
            h = m.quant_conv(h)
        posterior = DiagonalGaussianDistribution(h)
        return AutoencoderKLOutput(latent_dist=posterior) if return_dict else (posterior,)


def reach(*parts: nn.Module) -> int:
    """How far (input pixels) an output of `parts`, run in order, sees around it: each k×k
    convolution adds (k − 1) / 2 · dilation, a strided one one more (counted at the input's
    resolution: an upsampled layer's reach is less, so this is an upper bound)."""
    return sum(((m.kernel_size[0] - 1) // 2) * m.dilation[0] + (m.stride[0] > 1)
               for part in parts for m in part.modules() if isinstance(m, nn.Conv2d))


def _norms_of(*blocks: nn.Module) -> list[nn.GroupNorm]:
    """The GroupNorms of `blocks` in the order they run (registration order: resnets' norm1,
    norm2, then the next); a block with attention is not tileable (it sees the whole image)."""
    from diffusers.models.attention_processor import Attention

    if any(isinstance(m, Attention) for b in blocks for m in b.modules()):
        raise NotTileable("its full-resolution blocks attend over the whole image")
    return [m for b in blocks for m in b.modules() if isinstance(m, nn.GroupNorm)]


def _multiple(pixels: int, step: int) -> int:
    return -(-pixels // step) * step


def _tiled(part: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, norms: list[nn.GroupNorm],
           *, tile: int, halo: int) -> torch.Tensor:
    """`part(x)` computed tile by tile: `x` [B, C, H, W], tiles of `tile` pixels of `x` with
    `halo` of context; `part` may scale sides by whole factors (×2 up, ÷2 down: `tile` and
    `halo` then multiples of 2) and its GroupNorms are `norms`, in the order it runs them."""
    _, _, height, width = x.shape
    tiles = [(top, left, min(tile, height - top), min(tile, width - left))
             for top in range(0, height, tile) for left in range(0, width, tile)]
    stats: dict[nn.GroupNorm, tuple[torch.Tensor, torch.Tensor]] = {}
    for norm in norms:  # its whole-image statistics, the norms before it already whole-image
        sums: list[torch.Tensor] = []
        for top, left, h, w in tiles:
            crop, core = _crop(x, top, left, h, w, halo)
            with _norms(stats, collect=(norm, core, crop.shape[-1], sums)), \
                    contextlib.suppress(_Collected):
                part(crop)
        total = torch.stack(sums).sum(0)  # [B, G, 3]: count, Σx, Σx²
        count, s1, s2 = total.unbind(-1)
        mean = s1 / count
        stats[norm] = (mean, (s2 / count - mean * mean).clamp_min(0))
    out: torch.Tensor | None = None
    for top, left, h, w in tiles:
        crop, core = _crop(x, top, left, h, w, halo)
        with _norms(stats, collect=None):
            y = part(crop)
        f = Fraction(y.shape[-1], crop.shape[-1])
        if out is None:
            out = y.new_empty((*y.shape[:2], _at(height, f), _at(width, f)))
        out[..., _at(top, f):_at(top + h, f), _at(left, f):_at(left + w, f)] = y[_core(core, f)]
    assert out is not None
    return out


def _at(pixels: int, f: Fraction) -> int:
    scaled = pixels * f
    assert scaled.denominator == 1, (pixels, f)  # tiles sit on every layer's grid
    return int(scaled)


def _core(core: tuple[int, int, int, int], f: Fraction) -> tuple[Any, ...]:
    """The index of a tile's own part in an activation `f` times the crop's resolution."""
    y0, x0, h, w = core
    return (..., slice(_at(y0, f), _at(y0 + h, f)), slice(_at(x0, f), _at(x0 + w, f)))


def _crop(x: torch.Tensor, top: int, left: int, h: int, w: int, halo: int
          ) -> tuple[torch.Tensor, tuple[int, int, int, int]]:
    """The tile with `halo` of context (cut at the image's edges), and the tile's own part in
    it (y0, x0, h, w)."""
    y0, x0 = max(0, top - halo), max(0, left - halo)
    y1, x1 = min(x.shape[-2], top + h + halo), min(x.shape[-1], left + w + halo)
    return x[..., y0:y1, x0:x1], (top - y0, left - x0, h, w)


class _Collected(Exception):
    """Raised by the collecting norm: the rest of the tile's pass is not needed."""


@contextlib.contextmanager
def _norms(stats: dict[nn.GroupNorm, tuple[torch.Tensor, torch.Tensor]],
           collect: tuple[nn.GroupNorm, tuple[int, int, int, int], int, list[torch.Tensor]] | None
           ) -> Iterator[None]:
    """While the block runs: each norm in `stats` normalises with those statistics; the norm
    of `collect` adds (count, Σx, Σx²) per group of its input's tile part to the list and stops
    the pass."""
    handles = []

    def whole_image(norm: nn.GroupNorm, args: tuple[Any, ...], _out: Any) -> torch.Tensor:
        mean, var = stats[norm]
        t = args[0]
        b, c = t.shape[:2]
        g = norm.num_groups
        shaped = t.reshape(b, g, -1)
        y = (shaped - mean[..., None].to(t.dtype)) * torch.rsqrt(var[..., None] + norm.eps).to(t.dtype)
        y = y.reshape(t.shape)
        if norm.affine:
            y = y * norm.weight.view(1, c, *[1] * (t.dim() - 2)) + norm.bias.view(
                1, c, *[1] * (t.dim() - 2))
        return y

    for norm in stats:
        handles.append(norm.register_forward_hook(whole_image))
    if collect is not None:
        target, core, crop_width, sums = collect

        def gather(norm: nn.GroupNorm, args: tuple[Any, ...]) -> None:
            t = args[0][_core(core, Fraction(args[0].shape[-1], crop_width))].double()
            b = t.shape[0]
            per = t.reshape(b, norm.num_groups, -1)
            n = torch.full(per.shape[:2], float(per.shape[-1]), dtype=torch.float64,
                           device=per.device)
            sums.append(torch.stack([n, per.sum(-1), (per * per).sum(-1)], -1))
            raise _Collected

        handles.append(target.register_forward_pre_hook(gather))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
