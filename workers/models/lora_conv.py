"""LoCon: LoRAs on convolutions (kohya LoCon / LyCORIS conv LoRA on SDXL's UNet resnets), per
batch row, as workers/models/lora.py applies them to Linears.

A conv LoRA is a down conv A [r, in, kh, kw] with the base conv's stride and padding, then an
up conv B [out, r, 1, 1] (PEFT's LoRA Conv2d layer, which diffusers' loader builds): the delta
of a row is `strength · scale · B(A(x))`. Rows that carry the same LoRAs go as one group; each
group's LoRAs are added one after the other, as PEFT adds its adapters."""

from __future__ import annotations

from typing import Any

Tensor = Any  # torch.Tensor


def fits(module: Any, a: Tensor, b: Tensor) -> str | None:
    """Why A / B do not fit `module` (an nn.Conv2d), or None when they do."""
    if module.groups != 1 or tuple(module.dilation) != (1, 1) or module.padding_mode != "zeros":
        return (f"a grouped, dilated or {module.padding_mode}-padded Conv2d (groups "
                f"{module.groups}, dilation {tuple(module.dilation)}) takes no LoRA here")
    if a.ndim != 4 or b.ndim != 4 or tuple(a.shape[1:]) != (module.in_channels,
                                                             *module.kernel_size) or (
            tuple(b.shape) != (module.out_channels, a.shape[0], 1, 1)):
        return (f"A {tuple(a.shape)}, B {tuple(b.shape)} for a Conv2d {module.in_channels} → "
                f"{module.out_channels}, kernel {tuple(module.kernel_size)} (a LoCon down conv "
                "[r, in, kh, kw] and up conv [out, r, 1, 1])")
    return None


def add_deltas(name: str, module: Any, x: Tensor, output: Tensor,
               carried: list[list[Any]]) -> Tensor:
    """`output` [B, out, h, w] of conv `module` on x [B, in, H, W], plus each row's LoRA deltas
    (`carried[row]`: the AppliedLoras of the row that target `name`)."""
    import torch

    groups: dict[tuple[tuple[int, float], ...], list[int]] = {}
    for row, loras in enumerate(carried):
        if loras:
            key = tuple((id(lora.weights), lora.strength) for lora in loras)
            groups.setdefault(key, []).append(row)
    for rows in groups.values():
        every = len(rows) == len(carried)
        index = None if every else torch.tensor(rows, device=x.device)
        xs, part = (x, output) if index is None else (x[index], output[index])
        for lora in carried[rows[0]]:
            a, b, scale = lora.weights.modules[name]
            part = part + _delta(module, xs, a, b, scale * lora.strength)
        output = part if index is None else output.index_copy(0, index, part)
    return output


def _delta(module: Any, x: Tensor, a: Tensor, b: Tensor, weight: float) -> Tensor:
    import torch.nn.functional as F

    if a.device != x.device or a.dtype != x.dtype:  # an offloaded / upcast layer
        a, b = a.to(x.device, x.dtype), b.to(x.device, x.dtype)
    down = F.conv2d(x, a, None, module.stride, module.padding)  # [B, r, h, w]
    return F.conv2d(down, b) * weight  # [B, out, h, w]
