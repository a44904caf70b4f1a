"""The denoiser split over a torch.distributed group on CPU (gloo): real distributed work, no xfuser.

The same decomposition xfuser uses for Z-Image (its `xFuserZImageTransformer2DWrapper`), written
around diffusers' own modules so the gloo group can prove the protocol on CPU:

- **CFG-parallel** (`cfg=2`): a guided step has two items (positive, negative caption); cfg rank
  c computes item c alone, and the two outputs are all-gathered over the cfg group.
- **Sequence parallel** (`ulysses` × `ring` = sp): in the main (unified image + caption) layers
  each sp rank holds 1/sp of the tokens. A hook on every main layer hands it its shard of the
  mask and RoPE table (and, at the first layer, of the tokens: padded to a multiple of sp); the
  attention processor projects Q, K, V for its own tokens only, all-gathers K and V over the sp
  group, and attends its queries to every key; the last layer's output is all-gathered back to
  the whole sequence. The refiners, embedders and final layer run whole on every rank, as in
  xfuser. On CPU `ring` splits like `ulysses` (a K/V all-gather; ring attention passes the same
  K/V blocks peer to peer, overlapped with compute — that schedule is xfuser's, on GPUs).

Every rank ends a step with the same velocity (the gathers make it so), so every rank applies the
same Euler update and holds the same latents: no latents travel between steps.
Rank layout: rank = cfg_rank · sp + sp_rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from workers.parallel.config import Degrees


@dataclass
class _Shards:
    """What the hooks of one forward share: the full length, its padding, the full key mask."""

    length: int = 0  # tokens of the unified sequence
    pad: int = 0
    local: int = 0  # tokens this rank holds in the main layers
    key_mask: torch.Tensor | None = field(default=None, repr=False)  # [B, S + pad] bool


class CpuSplit:
    """The split denoiser of one rank; build it on every rank in the same order (it creates the
    process subgroups, a collective call)."""

    def __init__(self, degrees: Degrees, rank: int) -> None:
        self.degrees, self.rank = degrees, rank
        self.shards = _Shards()  # the last forward's main-layer split (what rank 0 reports)
        self.cfg_rank, self.sp_rank = divmod(rank, degrees.sp)
        self.sp_group = self.cfg_group = None
        for c in range(degrees.cfg):  # every rank creates every group, in the same order
            group = _new_group([c * degrees.sp + s for s in range(degrees.sp)], degrees.world)
            if c == self.cfg_rank:
                self.sp_group = group
        for s in range(degrees.sp):
            group = _new_group([c * degrees.sp + s for c in range(degrees.cfg)], degrees.world)
            if s == self.sp_rank:
                self.cfg_group = group

    def prepare(self, transformer: Any) -> Any:
        """Install the sequence split on `transformer`'s main layers (once per loaded model)."""
        if self.degrees.sp > 1:
            _install_sequence_split(transformer, self.sp_group, self.sp_rank, self.degrees.sp,
                                    self.shards)
        return transformer

    def report(self) -> dict[str, int]:
        """What the last forward split: the main layers' tokens, and this rank's share."""
        return {"tokens": self.shards.length, "local_tokens": self.shards.local}

    @torch.no_grad()
    def velocity(self, transformer: Any, latents: torch.Tensor, timestep: torch.Tensor,
                 positive: torch.Tensor, negative: torch.Tensor | None,
                 guidance: float) -> torch.Tensor:
        """The guided velocity [1, C, H, W] float32 of one job at one step (every rank)."""
        x = latents.to(transformer.dtype)[0].unsqueeze(1)  # [C, 1, H, W]
        t = (1000 - timestep.expand(1)) / 1000  # [1], 1 = clean
        caps = [positive.to(transformer.dtype)]
        if guidance > 0:
            assert negative is not None
            caps.append(negative.to(transformer.dtype))
        if self.degrees.cfg > 1 and len(caps) == 2:
            mine = transformer([x], t, [caps[self.cfg_rank]], return_dict=False)[0][0]
            outs = _all_gather(mine, self.cfg_group, self.degrees.cfg, dim=0, stack=True)
        else:  # no cfg split, or an unguided job on a cfg group: both halves compute it
            outs = transformer([x] * len(caps), t.expand(len(caps)), caps, return_dict=False)[0]
        pred = outs[0].float()
        if guidance > 0:
            pred = pred + guidance * (pred - outs[1].float())
        return -pred.unsqueeze(0).squeeze(2)  # [1, C, H, W]


def _new_group(ranks: list[int], world: int) -> Any:
    if len(ranks) == world:
        return None  # the default (world) group
    return dist.new_group(ranks)


def _all_gather(tensor: torch.Tensor, group: Any, size: int, *, dim: int,
                stack: bool = False) -> torch.Tensor:
    parts = [torch.empty_like(tensor) for _ in range(size)]
    dist.all_gather(parts, tensor.contiguous(), group=group)
    return torch.stack(parts, dim=dim) if stack else torch.cat(parts, dim=dim)


def _install_sequence_split(transformer: Any, group: Any, rank: int, size: int,
                            shards: _Shards) -> None:
    layers = list(transformer.layers)

    def shard(t: torch.Tensor, pad: int, fill: Any = 0) -> torch.Tensor:
        if pad:
            extra = torch.full((t.shape[0], pad, *t.shape[2:]), fill, dtype=t.dtype,
                               device=t.device)
            t = torch.cat([t, extra], dim=1)
        return t.chunk(size, dim=1)[rank]

    def before(layer: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        x, mask, freqs, *rest = args  # x [B, S(, local), D], mask [B, S], freqs [B, S, …]
        if layer is layers[0]:
            shards.length = x.shape[1]
            shards.pad = (-shards.length) % size
            if mask is None:
                mask = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
            shards.key_mask = torch.cat(
                [mask, mask.new_zeros((mask.shape[0], shards.pad))], dim=1)
            x = shard(x, shards.pad)
            shards.local = x.shape[1]
        local_mask = None if mask is None else shard(mask, shards.pad, False)
        return (x, local_mask, shard(freqs, shards.pad), *rest)

    def after(layer: Any, args: tuple[Any, ...], out: torch.Tensor) -> torch.Tensor:
        return _all_gather(out, group, size, dim=1)[:, : shards.length]

    for layer in layers:
        layer.register_forward_pre_hook(before)
        layer.attention.processor = SplitAttnProcessor(group, size, shards)
    layers[-1].register_forward_hook(after)


class SplitAttnProcessor:
    """Z-Image's single-stream attention for a shard of the tokens: Q, K, V of the local tokens,
    K and V all-gathered over the sp group, local queries against every key. Accepts and ignores
    extra keyword arguments (diffusers versions differ in what they pass)."""

    def __init__(self, group: Any, size: int, shards: _Shards) -> None:
        self.group, self.size, self.shards = group, size, shards

    def __call__(self, attn: Any, hidden_states: torch.Tensor,
                 encoder_hidden_states: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None,
                 freqs_cis: torch.Tensor | None = None, **_: Any) -> torch.Tensor:
        from diffusers.models.attention_dispatch import dispatch_attention_fn

        query = attn.to_q(hidden_states).unflatten(-1, (attn.heads, -1))  # [B, s, H, d]
        key = attn.to_k(hidden_states).unflatten(-1, (attn.heads, -1))
        value = attn.to_v(hidden_states).unflatten(-1, (attn.heads, -1))
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        if freqs_cis is not None:
            query, key = _rope(query, freqs_cis), _rope(key, freqs_cis)
        dtype = query.dtype
        key = _all_gather(key.to(dtype), self.group, self.size, dim=1)  # [B, S + pad, H, d]
        value = _all_gather(value, self.group, self.size, dim=1)
        mask = self.shards.key_mask
        out = dispatch_attention_fn(query.to(dtype), key, value,
                                    attn_mask=None if mask is None else mask[:, None, None, :],
                                    dropout_p=0.0, is_causal=False)
        out = attn.to_out[0](out.flatten(2, 3).to(dtype))
        return attn.to_out[1](out) if len(attn.to_out) > 1 else out


def _rope(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """diffusers' Z-Image rotary embedding, unchanged."""
    z = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(z * freqs_cis.unsqueeze(2)).flatten(3).type_as(x)

