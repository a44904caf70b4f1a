"""LoRA for every family, applied per batch row (S-LoRA / Punica style), never to the weights.

A `load/lora` node returns the model it got with one more `AppliedLora` on its `loras`
(workers/models/values.py `DiffusionModel.loras`): the base denoiser, its step batcher and its
weights are the very objects of the base model, shared by every run whatever its LoRAs.

- Reading: the family's plug-in function `lora_state_dict(path, denoiser)` turns a LoRA file (kohya /
  ComfyUI, diffusers / PEFT, …: diffusers' own converters) into `{module name: (A, B, scale)}`
  for the diffusers module names of its denoiser (A [r, in], B [out, r], scale alpha / r).
  `read_lora` checks every module against the loaded denoiser and keeps the weights on its
  device and dtype, cached per process by the file's content sha256.
- Applying: the first LoRA that targets a `nn.Linear` of a denoiser installs a forward hook on
  it (once; on the device thread, between forwards). Around each forward the family's `predict`
  says which LoRAs each batch row carries (`rows([...])`: a CFG job's two rows both carry the
  job's); the hook adds `strength · scale · B(A(x))` of each row's LoRAs to that row only:
  rows that all carry the same LoRAs as two plain matmuls each, mixed rows as one batched pair
  (each row's LoRAs stacked along the rank, the scale folded into B).
  A forward whose rows carry no LoRA gets nothing added (bit-identical to the hook-free model).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Tensor = Any  # torch.Tensor


class LoraMismatch(ValueError):
    """A LoRA file that does not fit the model (another family's, or other shapes)."""


@dataclass(frozen=True, eq=False)
class LoraWeights:
    """A LoRA file's low-rank weights for one denoiser: module name → (A, B, scale)."""

    name: str
    sha256: str
    modules: dict[str, tuple[Tensor, Tensor, float]]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b, _ in self.modules.values())


@dataclass(frozen=True, eq=False)
class AppliedLora:
    """One `load/lora` node's LoRA on a model: its weights at `strength`."""

    weights: LoraWeights
    strength: float


LORA_CACHE_SIZE = int(os.environ.get("INLINE_LORA_CACHE_SIZE", "").strip() or "32")
_ROWS = threading.local()  # .rows: the LoRAs of each row of the forward in flight, or None
_HOOKED_LOCK = threading.Lock()


@contextmanager
def rows(per_row: Sequence[tuple[AppliedLora, ...]]) -> Iterator[None]:
    """The LoRAs each row of the next forward carries (one entry per batch row, in order).
    No row with a LoRA: the hooks add nothing."""
    previous = getattr(_ROWS, "rows", None)
    _ROWS.rows = list(per_row) if any(per_row) else None
    try:
        yield
    finally:
        _ROWS.rows = previous


def _hook(name: str) -> Any:
    import torch
    import torch.nn.functional as F

    def add_deltas(module: Any, args: tuple[Any, ...], output: Tensor) -> Tensor | None:
        per_row = getattr(_ROWS, "rows", None)
        if per_row is None:
            return None
        x = args[0]
        if x.shape[0] != len(per_row):
            raise RuntimeError(f"LoRA on {name}: {x.shape[0]} rows in the forward, "
                               f"{len(per_row)} declared")
        carried = [[lora for lora in applied if name in lora.weights.modules]
                   for applied in per_row]
        members = [row for row, loras in enumerate(carried) if loras]
        if not members:
            return None
        keys = {tuple((id(lora.weights), lora.strength) for lora in carried[row])
                for row in members}
        if len(members) == len(per_row) and len(keys) == 1:  # every row the same LoRAs
            for lora in carried[0]:
                a, b, scale = lora.weights.modules[name]
                if a.device != x.device or a.dtype != x.dtype:  # an offloaded / upcast layer
                    a, b = a.to(x.device, x.dtype), b.to(x.device, x.dtype)
                output = output + F.linear(F.linear(x, a), b) * (scale * lora.strength)
            return output
        # Mixed rows (S-LoRA / Punica): each carrying row's LoRAs stacked along the rank (the
        # scale in B, zero-padded to the widest), one batched pair of matmuls for all of them.
        rank = max(sum(lora.weights.modules[name][0].shape[0] for lora in carried[row])
                   for row in members)
        a_rows = x.new_zeros(len(members), rank, x.shape[-1])
        b_rows = x.new_zeros(len(members), output.shape[-1], rank)
        for i, row in enumerate(members):
            offset = 0
            for lora in carried[row]:
                a, b, scale = lora.weights.modules[name]
                k = a.shape[0]
                a_rows[i, offset:offset + k] = a
                b_rows[i, :, offset:offset + k] = b * (scale * lora.strength)
                offset += k
        every = len(members) == len(per_row)
        index = None if every else torch.tensor(members, device=x.device)
        xs = x if index is None else x[index]
        flat = xs.reshape(len(members), -1, xs.shape[-1])
        delta = torch.bmm(torch.bmm(flat, a_rows.transpose(1, 2)), b_rows.transpose(1, 2))
        delta = delta.reshape(*xs.shape[:-1], output.shape[-1]).to(output.dtype)
        return output + delta if index is None else output.index_add(0, index, delta)

    return add_deltas


def install_hooks(transformer: Any, weights: LoraWeights) -> None:
    """Hook every module `weights` targets (once per module; call on the device thread)."""
    named = dict(transformer.named_modules())
    with _HOOKED_LOCK:
        for name in weights.modules:
            module = named[name]
            if not getattr(module, "_inline_lora_hooked", False):
                module.register_forward_hook(_hook(name))
                module._inline_lora_hooked = True


def check_fit(transformer: Any, modules: dict[str, tuple[Tensor, Tensor, float]],
              what: str) -> None:
    """LoraMismatch unless every module exists in `transformer` as an nn.Linear of A's input
    and B's output width."""
    import torch

    if not modules:
        raise LoraMismatch(f"{what} has no LoRA weights for this model's denoiser")
    named = dict(transformer.named_modules())
    missing = [m for m in modules if m not in named]
    if missing:
        raise LoraMismatch(f"{what} targets {len(missing)} module(s) this model does not have "
                           f"(e.g. {missing[0]}): a LoRA of another family or model")
    for name, (a, b, _) in modules.items():
        module = named[name]
        if not isinstance(module, torch.nn.Linear):
            raise LoraMismatch(f"{what} targets {name}, a {type(module).__name__}: only Linear "
                               "layers take LoRAs here")
        if a.shape[1] != module.in_features or b.shape[0] != module.out_features or (
                a.shape[0] != b.shape[1]):
            raise LoraMismatch(
                f"{what} does not fit {name}: A {tuple(a.shape)}, B {tuple(b.shape)} for a "
                f"Linear {module.in_features} → {module.out_features}")


_CACHES: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def lora_for(family_plugin: Any, path: Path, sha256: str, transformer: Any) -> LoraWeights:
    """`read_lora`, cached per base denoiser (the LoRAs go when it goes; the model cache's
    base models are not evicted by LoRAs) by the file's content sha256: the last
    INLINE_LORA_CACHE_SIZE (32) LoRAs of each denoiser."""
    from workers.models.cache import ModelCache

    with _HOOKED_LOCK:
        cache = _CACHES.get(transformer)
        if cache is None:
            cache = _CACHES[transformer] = ModelCache(max(1, LORA_CACHE_SIZE))
    return cache.get_or_load(sha256, lambda: read_lora(family_plugin, path, sha256, transformer))


def read_lora(family_plugin: Any, path: Path, sha256: str, transformer: Any) -> LoraWeights:
    """The LoRA file at `path` for `transformer` (checked, on its device and dtype, hooks
    installed). LoraMismatch when it does not fit."""
    try:
        modules = family_plugin.lora_state_dict(path, transformer)
    except (ValueError, KeyError) as exc:  # diffusers' converters reject foreign keys so
        detail = " ".join(str(exc).split())[:300]
        raise LoraMismatch(f"loras/{path.name} is not a LoRA this family reads: {detail}") from exc
    check_fit(transformer, modules, f"loras/{path.name}")
    from workers.counters import count

    count("lora_loads")
    device, dtype = transformer.device, transformer.dtype
    weights = LoraWeights(path.name, sha256, {
        name: (a.to(device=device, dtype=dtype).contiguous(),
               b.to(device=device, dtype=dtype).contiguous(), float(scale))
        for name, (a, b, scale) in modules.items()})
    install_hooks(transformer, weights)
    return weights


def peft_modules(state: dict[str, Tensor], alphas: dict[str, Any] | None,
                 prefix: str) -> dict[str, tuple[Tensor, Tensor, float]]:
    """{module: (A, B, alpha / r)} of a diffusers/PEFT state dict (`<prefix><module>.lora_A.
    weight` / `.lora_B.weight`, or `.lora.down.weight` / `.lora.up.weight`), with network
    alphas `<prefix><module>.alpha` (none: scale 1, as diffusers loads it). Keys of other
    prefixes (text encoders) are left out."""
    out: dict[str, tuple[Tensor, Tensor, float]] = {}
    for key, a in state.items():
        for down, up in ((".lora_A.weight", ".lora_B.weight"),
                         (".lora.down.weight", ".lora.up.weight")):
            if key.startswith(prefix) and key.endswith(down):
                module = key[len(prefix):-len(down)]
                b = state[key[:-len(down)] + up]
                alpha = (alphas or {}).get(f"{prefix}{module}.alpha")
                rank = a.shape[0]
                out[module] = (a, b, 1.0 if alpha is None else float(alpha) / rank)
    return out
