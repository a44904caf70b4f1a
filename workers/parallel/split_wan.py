"""Wan's denoiser split over a torch.distributed group: one video's tokens across the sp ranks.

The same decomposition as Z-Image's (split.py), for diffusers' WanTransformer3DModel:

- **Sequence parallel**: the patch embedding turns latents [B, C, F', h, w] into the token
  sequence [B, F'·(h/2)·(w/2), D] (frames outermost), which every block keeps. A hook on every
  block hands it its shard of the tokens (at the first block: padded to a multiple of sp), of the
  3-D RoPE table and, for TI2V's per-token timesteps, of the modulation; self-attention projects
  Q, K, V of its own tokens, all-gathers K and V over the sp group and attends its queries to
  every key (padding masked out); cross-attention to the prompt and the feed-forward are
  per-token, so they run on the shard unchanged. The last block's output is all-gathered back
  to the whole sequence; the head and unpatchify run whole on every rank.
- **CFG-parallel** (`cfg=2`): cfg rank c computes half c of every job (the conditional or the
  unconditional prompt; an unguided job's one on both) and the outputs are all-gathered.

Velocities are the engine's (workers/models/wan/engine.py): `uncond + g·(cond − uncond)`, shaped
as the job's latents. A forward's jobs are grouped by latent shape (one RoPE table per size), as
the engine's `predict` groups them.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from workers.models.wan.engine import kept, per_token, token_timesteps
from workers.parallel.collectives import all_gather_items


def is_wan(transformer: Any) -> bool:
    from diffusers import WanTransformer3DModel

    return isinstance(transformer, WanTransformer3DModel)


def install_sequence_split(transformer: Any, group: Any, rank: int, size: int,
                           shards: Any) -> None:
    """Hooks on every block of `transformer` and a split self-attention (see the module)."""
    blocks = list(transformer.blocks)

    def shard(t: torch.Tensor, fill: Any = 0) -> torch.Tensor:  # dim 1 is the token axis
        if shards.pad:
            extra = torch.full((t.shape[0], shards.pad, *t.shape[2:]), fill, dtype=t.dtype,
                               device=t.device)
            t = torch.cat([t, extra], dim=1)
        return t.chunk(size, dim=1)[rank]

    def before(block: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        x, context, temb, rotary = args  # x [B, S(, local), D]; rotary ([1, S, 1, d],) * 2
        if block is blocks[0]:
            shards.length = x.shape[1]
            shards.pad = (-shards.length) % size
            ones = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
            shards.key_mask = torch.cat([ones, ones.new_zeros((x.shape[0], shards.pad))], dim=1)
            x = shard(x)
            shards.local = x.shape[1]
        if temb.ndim == 4:  # TI2V: a modulation per token [B, S, 6, D]
            temb = shard(temb)
        return (x, context, temb, tuple(shard(r) for r in rotary))

    def after(block: Any, args: tuple[Any, ...], out: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(out) for _ in range(size)]
        dist.all_gather(parts, out.contiguous(), group=group)
        return torch.cat(parts, dim=1)[:, : shards.length]

    for block in blocks:
        block.register_forward_pre_hook(before)
        block.attn1.processor = SplitSelfAttnProcessor(group, size, shards)
    blocks[-1].register_forward_hook(after)


class SplitSelfAttnProcessor:
    """Wan's self-attention (diffusers' WanAttnProcessor, attn1) for a shard of the tokens."""

    def __init__(self, group: Any, size: int, shards: Any) -> None:
        self.group, self.size, self.shards = group, size, shards

    def __call__(self, attn: Any, hidden_states: torch.Tensor,
                 encoder_hidden_states: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None,
                 rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
                 **_: Any) -> torch.Tensor:
        from diffusers.models.attention_dispatch import dispatch_attention_fn
        from diffusers.models.transformers.transformer_wan import _get_qkv_projections

        query, key, value = _get_qkv_projections(attn, hidden_states, None)  # type: ignore[arg-type]  # self-attention: diffusers passes None too
        query = attn.norm_q(query).unflatten(2, (attn.heads, -1))  # [B, s, H, d]
        key = attn.norm_k(key).unflatten(2, (attn.heads, -1))
        value = value.unflatten(2, (attn.heads, -1))
        if rotary_emb is not None:
            query, key = _rope(query, *rotary_emb), _rope(key, *rotary_emb)
        key, value = self._gather(key), self._gather(value)  # [B, S + pad, H, d]
        mask = None if not self.shards.pad else self.shards.key_mask[:, None, None, :]
        out = dispatch_attention_fn(query, key, value, attn_mask=mask, dropout_p=0.0,
                                    is_causal=False)
        out = out.flatten(2, 3).type_as(query)
        return attn.to_out[1](attn.to_out[0](out))

    def _gather(self, t: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(t) for _ in range(self.size)]
        dist.all_gather(parts, t.contiguous(), group=self.group)
        return torch.cat(parts, dim=1)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """diffusers' Wan rotary embedding (interleaved pairs), unchanged."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = cos[..., 0::2], sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(x)


@torch.no_grad()
def velocities(split: Any, transformer: Any, items: list[Any]) -> list[torch.Tensor]:
    """Each StepItem's guided velocity, shaped as its latents, float32 (every rank calls it
    with the same items; `split` is the rank's CpuSplit: its degrees and groups)."""
    out: dict[int, torch.Tensor] = {}
    sizes: dict[tuple[Any, ...], list[int]] = {}
    for index, item in enumerate(items):
        key = (tuple(item.latents.shape), getattr(item, "condition", None) is not None)
        sizes.setdefault(key, []).append(index)
    for members in sizes.values():
        group = [items[i] for i in members]
        for i, velocity in zip(members, _shape_group(split, transformer, group), strict=True):
            out[i] = velocity
    return [out[i] for i in range(len(items))]


def _shape_group(split: Any, transformer: Any, items: list[Any]) -> list[torch.Tensor]:
    if split.degrees.cfg == 1:  # every item's rows in one forward: conditional, unconditional
        rows: list[tuple[Any, torch.Tensor]] = []
        for item in items:
            rows += [(item, p) for p in _halves(item)]
        pred, pairs, k = _forward(transformer, rows), [], 0
        for item in items:
            guided = len(_halves(item)) == 2
            pairs.append((pred[k], pred[k + 1] if guided else None))
            k += 2 if guided else 1
    else:  # cfg rank c computes half c of every item; an unguided item's one on both
        mine = [(item, _halves(item)[min(split.cfg_rank, len(_halves(item)) - 1)])
                for item in items]
        pred = _forward(transformer, mine)

        cond, uncond = all_gather_items(list(pred), split.cfg_group, 2)
        pairs = [(c, u if len(_halves(item)) == 2 else None)
                 for item, c, u in zip(items, cond, uncond, strict=True)]
    velocities: list[torch.Tensor] = []
    for item, (positive, negative) in zip(items, pairs, strict=True):
        pred = positive if negative is None else negative + item.guidance * (positive - negative)
        velocities.append(pred.reshape(item.latents.shape).float())
    return velocities


def _halves(item: Any) -> list[torch.Tensor]:
    """The prompts a job puts in a forward: positive, and negative when guided (job.cfg)."""
    if item.guidance > 0 and item.negative is not None:
        return [item.positive, item.negative]
    return [item.positive]


def _forward(transformer: Any, rows: list[tuple[Any, torch.Tensor]]) -> torch.Tensor:
    """One transformer forward over `rows` (item, prompt [512, D]) → [R, 16, F', h, w]."""
    dtype = transformer.dtype
    x = torch.cat([_model_input(item) for item, _ in rows]).to(dtype)  # [R, C_in, F', h, w]
    embeds = torch.stack([prompt for _, prompt in rows]).to(dtype)  # [R, 512, D]
    if per_token(transformer):  # TI2V-5B: [R, tokens], the engine's
        t = torch.stack([token_timesteps(item.timestep, item.latents, item.keep)
                         for item, _ in rows]).to(dtype)
    else:
        t = torch.stack([item.timestep for item, _ in rows]).to(dtype)  # [R]
    return transformer(hidden_states=x, timestep=t, encoder_hidden_states=embeds,
                       return_dict=False)[0]


def _model_input(item: Any) -> torch.Tensor:
    """The latents [1, 16, F', h, w] (a still's [1, 16, h, w] as one frame; TI2V's kept start
    frame put in), then the I2V condition when the job carries one."""
    x = kept(item.latents, getattr(item, "keep", None))
    condition = getattr(item, "condition", None)
    return x if condition is None else torch.cat([x, condition.to(x.device, x.dtype)], dim=1)
