"""The `flux2/scheduler` node: ComfyUI's Flux2Scheduler, FLUX.2's sigmas for a step count and an
image size (the empirical shift from the image's 16-px tokens and the steps). Its width and
height may be wired (ComfyUI's edit templates feed them from the reference's GetImageSize).
Registered with the family (FAMILY.nodes)."""

from __future__ import annotations

from typing import Any

from workers.models.values import Sigmas
from workers.runners.base import NodeContext, NodeFailed, runner


@runner("flux2/scheduler")
def flux2_scheduler(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    import torch

    from workers.models.flux2 import comfy_sigmas

    steps, width, height = (int(inputs.get(k, params[k])) for k in ("steps", "width", "height"))
    if steps < 1 or width < 16 or height < 16:
        raise NodeFailed(f"FLUX.2's scheduler needs steps ≥ 1 and sides ≥ 16 px, got {steps} "
                         f"steps at {width}×{height}")
    return {"sigmas": Sigmas(values=torch.tensor(comfy_sigmas(steps, width, height),
                                                 dtype=torch.float32))}
