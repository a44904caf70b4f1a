"""A family's own denoiser forward split over a torch.distributed group: FLUX.1, FLUX.2,
Qwen-Image (and its edit models), Krea 2 and Wan on the ranks run the family's `predict`
unchanged (workers/models/<family>/engine.py: the same rows, guidance, layouts, I2V conditions
and TI2V per-token steps as on one device); the split lives on the transformer:

Each family's plugin says how (`split_plan(transformer)`: the context-parallel plan for the
arguments its predict passes, and which forward arguments hold one entry per batch row); this
module knows no family.

- **Sequence parallel** (`ulysses` × `ring` = sp): diffusers' own context parallelism
  (`_cp_plan` on its FLUX.1, FLUX.2, Qwen-Image and Wan transformers, xDiT's Ulysses attention
  built into diffusers; Krea 2's plan is the family's own): every sp rank holds 1/sp of the
  tokens from the first block on, all-to-alls heads ↔ tokens around each attention, and the
  output is all-gathered back
  (by this module: the ranks' shares differ by a token when sp does not divide the tokens).
  It runs as Ulysses of degree sp in "anything" mode (any token and head count); Ring attention
  needs a backend that returns the log-sum-exp, which torch's native SDPA on CPU does not, so
  a ring degree splits as Ulysses here — the same tokens per rank.
- **CFG-parallel** (`cfg=2`): the rows of every transformer call (a guided job's conditional and
  unconditional rows, other jobs' rows) are divided between the cfg ranks, padded to an even
  count with a copy of the last row, and the outputs all-gathered back in order. A guided job
  alone is exactly CFG-parallel (its two rows on two ranks); a forward of several jobs is
  divided by rows, whichever job they belong to.

Every rank ends a forward holding every row's output (the gathers make it so); the family's
predict then mixes guidance as it always does. Rank layout: rank = cfg_rank · sp + sp_rank.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from workers.parallel.collectives import all_gather, all_gather_uneven
from workers.parallel.config import Degrees

log = logging.getLogger(__name__)


def handles(family_plugin: Any) -> bool:
    """Whether this module splits the family's transformer: its plugin says how
    (`split_plan(transformer)` -> (context-parallel plan, the forward's per-row arguments))."""
    return callable(getattr(family_plugin, "split_plan", None))


def context_parallel_input(split_dim: int, dims: int, output: bool = False) -> Any:
    """diffusers' ContextParallelInput, for the families' plans."""
    from diffusers.models._modeling_parallel import ContextParallelInput

    return ContextParallelInput(split_dim=split_dim, expected_dims=dims, split_output=output)


def context_parallel_output(gather_dim: int, dims: int) -> Any:
    """diffusers' ContextParallelOutput, for the families' plans."""
    from diffusers.models._modeling_parallel import ContextParallelOutput

    return ContextParallelOutput(gather_dim=gather_dim, expected_dims=dims)


class FamilySplit:
    """The split of one rank for the families above; build it on every rank in the same order
    (it creates the device mesh, a collective call)."""

    def __init__(self, degrees: Degrees, rank: int, device: torch.device) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        self.degrees, self.rank, self.device = degrees, rank, device
        self.cfg_rank = rank // degrees.sp
        # rank = cfg_rank · sp + sp_rank, sp as (ring = 1, ulysses = sp): see the module
        self.mesh = init_device_mesh(device.type, (degrees.cfg, 1, degrees.sp),
                                     mesh_dim_names=("cfg", "ring", "ulysses"))
        self.cfg_group = self.mesh["cfg"].get_group() if degrees.cfg > 1 else None
        self.models: set[int] = set()  # the transformers prepared here (by id)
        self.rows = 0  # the last forward's rows (what rank 0 reports)
        self.tokens = 0  # and its tokens per row before the sequence split

    def prepare(self, transformer: Any, family_plugin: Any) -> Any:
        """Install the split on `transformer` as its family's `split_plan` says."""
        plan, rows = family_plugin.split_plan(transformer)
        if self.degrees.sp > 1:
            self._context_parallel(transformer, plan)
        self._row_split(transformer, rows)
        self._count_tokens(transformer, plan)
        self.models.add(id(transformer))
        return transformer

    @torch.no_grad()
    def velocities(self, transformer: Any, items: list[Any], predict: Any) -> list[torch.Tensor]:
        """Each StepItem's velocity from the family's `predict` over the forward's jobs (every
        rank calls it with the same items); each item's `extra` learns how many jobs shared
        its forward (the family's layouts: FORWARD_JOBS)."""
        from workers.sampling.batcher import FORWARD_JOBS

        jobs = [item.job() for item in items]
        velocities = predict(transformer, jobs)
        for item, job in zip(items, jobs, strict=True):
            if FORWARD_JOBS in job.extra:
                item.extra[FORWARD_JOBS] = job.extra[FORWARD_JOBS]
        return list(velocities)

    def report(self) -> dict[str, int]:
        """What the last forward split: tokens per row, this rank's share of them, its rows."""
        sp, cfg = self.degrees.sp, self.degrees.cfg
        return {"tokens": self.tokens, "local_tokens": -(-self.tokens // sp),
                "rows": self.rows, "local_rows": -(-self.rows // cfg)}

    def _context_parallel(self, transformer: Any, own: dict[str, Any]) -> None:
        """diffusers' `enable_parallelism` for context parallelism, with this rank's device:
        its own call derives the device from the accelerator count, which is 0 on CPU."""
        from diffusers.hooks.context_parallel import apply_context_parallel
        from diffusers.models._modeling_parallel import ContextParallelConfig, ParallelConfig

        _context_parallel_backend(transformer)
        cp = ContextParallelConfig(ulysses_degree=self.degrees.sp, ulysses_anything=True)
        config = ParallelConfig(context_parallel_config=cp)
        config.setup(self.rank, self.degrees.world, self.device,
                     mesh=self.mesh["ring", "ulysses"])
        transformer._parallel_config = config
        for module in transformer.modules():
            processor = getattr(module, "processor", None)
            if processor is not None and hasattr(processor, "_parallel_config"):
                processor._parallel_config = config
        inputs = {name: entry for name, entry in own.items() if isinstance(entry, dict)}
        apply_context_parallel(transformer, cp, inputs)
        group, size = self.mesh["ulysses"].get_group(), self.degrees.sp
        for name, entry in own.items():  # the gathers, uneven-safe (diffusers' need equal parts)
            if not isinstance(entry, dict):
                transformer.get_submodule(name).register_forward_hook(
                    lambda _m, _a, out, dim=entry.gather_dim: all_gather_uneven(
                        out, group, size, dim=dim))

    def _count_tokens(self, transformer: Any, own: dict[str, Any]) -> None:
        """The report's tokens: the hidden states' where the plan starts the sequence split
        (a torch pre-hook runs before diffusers' split of the same module)."""
        name = next(key for key, entry in own.items()
                    if isinstance(entry, dict) and "hidden_states" in entry)
        split = self

        def count(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            split.tokens = hidden.shape[1]

        transformer.get_submodule(name).register_forward_pre_hook(count, with_kwargs=True)

    def _row_split(self, transformer: Any, names: tuple[str, ...]) -> None:
        size, rank, split = self.degrees.cfg, self.cfg_rank, self

        def before(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            hidden = kwargs["hidden_states"]  # the families' predicts pass keywords
            split.rows = hidden.shape[0]
            if size == 1:
                return None
            pad = (-split.rows) % size
            per = (split.rows + pad) // size
            for name in names:
                value = kwargs.get(name)
                if value is not None:
                    kwargs[name] = _rows(value, pad, rank * per, per)
            return args, kwargs

        def after(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
            if size == 1:
                return out
            first = out[0] if isinstance(out, tuple) else out.sample
            whole = all_gather(first, split.cfg_group, size, dim=0)[: split.rows]
            if isinstance(out, tuple):
                return (whole, *out[1:])
            out.sample = whole
            return out

        transformer.register_forward_pre_hook(before, with_kwargs=True)
        transformer.register_forward_hook(after, with_kwargs=True)


def _context_parallel_backend(transformer: Any) -> None:
    """Keep the attention backend the policy chose (INLINE_ATTENTION) when diffusers' context
    parallelism supports it (native, cuDNN, flash, sage); else torch SDPA for this split, said
    in the log."""
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    for module in transformer.modules():
        processor = getattr(module, "processor", None)
        if processor is None or not hasattr(processor, "_attention_backend"):
            continue
        chosen = processor._attention_backend or _AttentionBackendRegistry.get_active_backend()[0]
        if not _AttentionBackendRegistry._is_context_parallel_available(
                AttentionBackendName(chosen)):
            log.warning("attention backend %s cannot split tokens across ranks; this group "
                        "uses native (torch SDPA)", AttentionBackendName(chosen).value)
            transformer.set_attention_backend("native")
        return


def _rows(value: Any, pad: int, start: int, count: int) -> Any:
    """Rows start … start + count of a per-row argument (a tensor's first dimension or a list),
    after padding it with `pad` copies of its last row."""
    if isinstance(value, torch.Tensor):
        if pad:
            value = torch.cat([value, value[-1:].expand(pad, *value.shape[1:])])
        return value[start: start + count]
    value = list(value) + [value[-1]] * pad
    return value[start: start + count]
