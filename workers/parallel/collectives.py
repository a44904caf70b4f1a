"""The all-gathers the split denoisers share (split.py, split_family.py)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def all_gather_items(outs: list[torch.Tensor], group: Any, size: int) -> list[list[torch.Tensor]]:
    """Every cfg rank's per-item outputs, in one all-gather: item i has the same shape on every
    rank (it is the same job's latents), so the flattened lists line up."""
    flat = torch.cat([o.reshape(-1) for o in outs])
    parts = [torch.empty_like(flat) for _ in range(size)]
    dist.all_gather(parts, flat.contiguous(), group=group)
    result = []
    for part in parts:
        pieces, offset = [], 0
        for o in outs:
            pieces.append(part[offset: offset + o.numel()].view_as(o))
            offset += o.numel()
        result.append(pieces)
    return result


def all_gather(tensor: torch.Tensor, group: Any, size: int, *, dim: int) -> torch.Tensor:
    parts = [torch.empty_like(tensor) for _ in range(size)]
    dist.all_gather(parts, tensor.contiguous(), group=group)
    return torch.cat(parts, dim=dim)


def all_gather_uneven(tensor: torch.Tensor, group: Any, size: int, *, dim: int) -> torch.Tensor:
    """Every rank's `tensor` concatenated along `dim` in rank order, where the ranks' lengths
    along `dim` may differ (gloo's all-gather wants equal shapes: each part is padded to the
    longest and trimmed back)."""
    length = torch.tensor([tensor.shape[dim]], device=tensor.device)
    lengths = [torch.empty_like(length) for _ in range(size)]
    dist.all_gather(lengths, length, group=group)
    sizes = [int(n) for n in lengths]
    longest = max(sizes)
    if tensor.shape[dim] < longest:
        shape = list(tensor.shape)
        shape[dim] = longest - tensor.shape[dim]
        tensor = torch.cat([tensor, tensor.new_zeros(shape)], dim=dim)
    parts = [torch.empty_like(tensor) for _ in range(size)]
    dist.all_gather(parts, tensor.contiguous(), group=group)
    return torch.cat([part.narrow(dim, 0, n) for part, n in zip(parts, sizes, strict=True)],
                     dim=dim)
