"""The GPU split: xfuser 0.7's Z-Image transformer wrapper on an NCCL group (one rank per GPU).

NEVER RUN in this repository's CI (xfuser's imports fail without CUDA, FACTS.md); the CPU twin
that is tested is workers/parallel/split.py, which splits the model the same way.

The only module that imports xfuser. Install it with `pip install -e '.[parallel]'` (xfuser 0.7.0,
nvidia-ml-py) in the group worker's environment; the farm itself never needs it.

diffusers 0.42 vs xfuser 0.7 (`joint_attention_kwargs` TypeError, FACTS.md): we ADAPT THE CALL
rather than pin diffusers 0.41. The TypeError comes from xfuser's pipeline wrapper handing the
0.42 transformer signature arguments its own `forward(x, t, cap_feats, patch_size, f_patch_size,
return_dict)` does not take; we never use xfuser's pipeline — our step loop calls the wrapper's
forward with exactly those arguments — and we give every main-layer processor a shim that drops
keyword arguments xfuser's processor does not declare.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from workers.parallel.config import Degrees


class XfuserSplit:
    """One rank's xfuser state; created after torch.distributed is initialised (NCCL)."""

    def __init__(self, degrees: Degrees, rank: int, world: int) -> None:
        from xfuser.core.distributed import (
            init_distributed_environment,
            initialize_model_parallel,
        )

        init_distributed_environment(rank=rank, world_size=world)  # reuses our default group
        initialize_model_parallel(
            classifier_free_guidance_degree=degrees.cfg,
            sequence_parallel_degree=degrees.sp,
            ulysses_degree=degrees.ulysses,
            ring_degree=degrees.ring,
        )
        self.degrees = degrees
        # FLUX.1, FLUX.2, Qwen-Image, Krea 2, Wan: xfuser 0.7's wrappers are not used; the
        # torch.distributed splits that the CPU tests prove (split_family.py: its
        # process groups and device mesh built here on NCCL) run them on the GPUs.
        from workers.parallel.split import CpuSplit

        self.torch_split = CpuSplit(degrees, rank, torch.device("cuda", rank))

    def prepare(self, transformer: Any, family_plugin: Any = None) -> Any:
        from workers.parallel import split_family

        if split_family.handles(family_plugin):
            return self.torch_split.prepare(transformer, family_plugin)
        from xfuser.model_executor.models.transformers.transformer_z_image import (
            xFuserZImageTransformer2DWrapper,
        )

        wrapper = xFuserZImageTransformer2DWrapper(transformer)
        for layer in transformer.layers:
            layer.attention.processor = _DeclaredKwargsOnly(layer.attention.processor)
        return wrapper

    def report(self) -> dict[str, int]:
        split = self.torch_split
        return split.report() if split.shards.length or split.last is split.family else {}

    def velocities(self, transformer: Any, items: list[Any],
                   predict: Any = None) -> list[torch.Tensor]:
        """As CpuSplit.velocities, but one wrapper forward per item: xfuser 0.7's wrapper splits
        a forward's item list over the cfg group itself, and whether it does so for several
        jobs' items at once has not been checked on GPUs. Jobs still join, leave, report and
        cancel per step through the step batcher; only the forward is not shared. Every other
        family (split_family.py): its own predict on the torch split, one shared forward."""
        if id(transformer) in self.torch_split.family.models:
            return self.torch_split.velocities(transformer, items, predict)
        return [self._velocity(transformer, item) for item in items]

    @torch.no_grad()
    def _velocity(self, transformer: Any, item: Any) -> torch.Tensor:
        """One job's guided velocity [1, C, H, W] float32 (an unguided job on a cfg group
        sends its one item twice: both halves compute it)."""
        dtype = next(transformer.parameters()).dtype
        x = item.latents.to(dtype)[0].unsqueeze(1)  # [C, 1, H, W]
        t = (1000 - item.timestep.expand(1)) / 1000
        guided = item.guidance > 0 and item.negative is not None
        caps = [item.positive.to(dtype), (item.negative if guided else item.positive).to(dtype)]
        if not guided and self.degrees.cfg == 1:
            caps = caps[:1]
        outs = transformer([x] * len(caps), t.expand(len(caps)), caps, return_dict=False)[0]
        pred = outs[0].float()
        if guided:
            pred = pred + item.guidance * (pred - outs[1].float())
        return -pred.unsqueeze(0).squeeze(2)


class _DeclaredKwargsOnly:
    """Calls an attention processor with only the keyword arguments it declares."""

    def __init__(self, processor: Any) -> None:
        self.processor = processor
        self.names = set(inspect.signature(processor.__call__).parameters)

    def __call__(self, attn: Any, hidden_states: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return self.processor(attn, hidden_states,
                              **{k: v for k, v in kwargs.items() if k in self.names})
