"""The denoiser split over a torch.distributed group on CPU (gloo): real distributed work, no xfuser.

The same decomposition xfuser uses for Z-Image (its `xFuserZImageTransformer2DWrapper`), written
around diffusers' own modules so the gloo group can prove the protocol on CPU:

- **CFG-parallel** (`cfg=2`): a guided job has two items (positive, negative caption); cfg rank
  c computes half c of every job of the forward (an unguided job's one item on both), and the
  outputs are all-gathered over the cfg group.
- **Sequence parallel** (`ulysses` × `ring` = sp): in the main (unified image + caption) layers
  each sp rank holds 1/sp of the tokens. A hook on every main layer hands it its shard of the
  mask and RoPE table (and, at the first layer, of the tokens: padded to a multiple of sp); the
  attention processor projects Q, K, V for its own tokens only, all-gathers K and V over the sp
  group, and attends its queries to every key; the last layer's output is all-gathered back to
  the whole sequence. The refiners, embedders and final layer run whole on every rank, as in
  xfuser. On CPU `ring` splits like `ulysses` (a K/V all-gather; ring attention passes the same
  K/V blocks peer to peer, overlapped with compute — that schedule is xfuser's, on GPUs).

A forward may hold several jobs (the Celery process's step batcher made it): different sizes,
captions, step positions and guidance, as in one process. Every rank ends a forward holding
every job's velocity (the gathers make it so); rank 0 sends them back.
Rank layout: rank = cfg_rank · sp + sp_rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from workers.parallel.collectives import all_gather, all_gather_items
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

    def __init__(self, degrees: Degrees, rank: int, device: Any = None) -> None:
        from workers.parallel.split_family import FamilySplit

        self.degrees, self.rank = degrees, rank
        self.shards = _Shards()  # the last forward's main-layer split (what rank 0 reports)
        self.last: Any = self  # which split served the last forward
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
        # FLUX.1, FLUX.2, Qwen-Image, Krea 2: their own predict, split on the transformer
        self.family = FamilySplit(degrees, rank, torch.device("cpu") if device is None else device)

    def prepare(self, transformer: Any, family_plugin: Any = None) -> Any:
        """Install the sequence split on `transformer`'s main layers (once per loaded model):
        Z-Image's here, every family whose plugin has a `split_plan` in split_family.py."""
        from workers.parallel import split_family

        if split_family.handles(family_plugin):
            self.last = self.family
            return self.family.prepare(transformer, family_plugin)
        if self.degrees.sp > 1:
            _install_sequence_split(transformer, self.sp_group, self.sp_rank, self.degrees.sp,
                                    self.shards)
        return transformer

    def report(self) -> dict[str, int]:
        """What the last forward split: the main layers' tokens, and this rank's share."""
        if self.last is self.family:
            return self.family.report()
        return {"tokens": self.shards.length, "local_tokens": self.shards.local}

    @torch.no_grad()
    def velocities(self, transformer: Any, items: list[Any],
                   predict: Any = None) -> list[torch.Tensor]:
        """The guided velocity [1, C, H, W] float32 of every StepItem of one forward (every
        rank calls it with the same items); a split_family model's from its family's
        `predict`, shaped as its latents, as on one device."""
        if id(transformer) in self.family.models:
            self.last = self.family
            return self.family.velocities(transformer, items, predict)
        self.last = self
        dtype = transformer.dtype
        if self.degrees.cfg == 1:  # one forward over every item, both halves of a guided one
            xs, ts, caps = [], [], []
            for item in items:
                halves = _halves(item, dtype)
                xs += [_x(item, dtype)] * len(halves)
                ts += [_t(item)] * len(halves)
                caps += halves
            outs = transformer(xs, torch.cat(ts), caps, return_dict=False)[0]
            pairs, k = [], 0
            for item in items:
                pairs.append((outs[k], outs[k + 1] if item.guidance > 0 else None))
                k += 2 if item.guidance > 0 else 1
        else:  # cfg rank c computes half c of every item; an unguided item's one on both
            mine = []
            for item in items:
                halves = _halves(item, dtype)
                mine.append(halves[min(self.cfg_rank, len(halves) - 1)])
            outs = transformer([_x(item, dtype) for item in items],
                               torch.cat([_t(item) for item in items]), mine,
                               return_dict=False)[0]
            positive, negative = all_gather_items(list(outs), self.cfg_group, 2)  # cfg is 2
            pairs = [(p, n if item.guidance > 0 else None)
                     for item, p, n in zip(items, positive, negative, strict=True)]
        velocities = []
        for item, (pos, neg) in zip(items, pairs, strict=True):
            pred = pos.float()
            if neg is not None:
                pred = pred + item.guidance * (pred - neg.float())
            velocities.append(-pred.unsqueeze(0).squeeze(2))  # [1, C, H, W]
        return velocities


def _x(item: Any, dtype: torch.dtype) -> torch.Tensor:
    return item.latents.to(dtype)[0].unsqueeze(1)  # [C, 1, H, W]


def _t(item: Any) -> torch.Tensor:
    return (1000 - item.timestep.expand(1)) / 1000  # [1], 1 = clean


def _halves(item: Any, dtype: torch.dtype) -> list[torch.Tensor]:
    """The captions a job puts in a forward: positive, and negative when guided."""
    if item.guidance > 0:
        return [item.positive.to(dtype), item.negative.to(dtype)]
    return [item.positive.to(dtype)]


def _new_group(ranks: list[int], world: int) -> Any:
    if len(ranks) == world:
        return None  # the default (world) group
    return dist.new_group(ranks)


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
        return all_gather(out, group, size, dim=1)[:, : shards.length]

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
        key = all_gather(key.to(dtype), self.group, self.size, dim=1)  # [B, S + pad, H, d]
        value = all_gather(value, self.group, self.size, dim=1)
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

