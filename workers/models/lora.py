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
- Convolutions (LoCon: kohya / LyCORIS conv LoRAs on SDXL's UNet resnets): the same hooks on
  nn.Conv2d, a down conv k×k and an up conv 1×1 per row group (workers/models/lora_conv.py).
- Text encoders (`strength_clip`, ComfyUI's LoraLoader's CLIP half): the same hooks on the
  encoder's Linear layers. A family that reads text-encoder LoRAs names its encoders
  (`text_encoder_parts(encoder)`: {"text_encoder": CLIP-L, …}, diffusers' component names) and
  converts a file's weights for them (`text_encoder_lora_state_dict`); the encode coalescer
  declares each text's LoRAs (`encode_rows`), so the shared base encoder is never changed and
  encodes with different LoRA sets share one forward.
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

from workers.models import lora_conv

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
        carried = [[lora for lora in applied if name in lora.weights.modules]
                   for applied in per_row]
        members = [row for row, loras in enumerate(carried) if loras]
        if not members:
            return None
        keys = {tuple((id(lora.weights), lora.strength) for lora in carried[row])
                for row in members}
        uniform = len(members) == len(per_row) and len(keys) == 1
        # a module whose rows are not the batch's (MiniMax-H3's AdaLN of each distinct
        # timestep) takes the LoRAs only when every row carries the same ones
        if x.shape[0] != len(per_row) and (not uniform or isinstance(module, torch.nn.Conv2d)):
            raise RuntimeError(f"LoRA on {name}: {x.shape[0]} rows in the forward, "
                               f"{len(per_row)} declared")
        if isinstance(module, torch.nn.Conv2d):  # LoCon: workers/models/lora_conv.py
            return lora_conv.add_deltas(name, module, x, output, carried)
        if uniform:  # every row the same LoRAs
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
    and B's output width, or an nn.Conv2d of a LoCon's shapes (workers/models/lora_conv.py)."""
    import torch

    named = dict(transformer.named_modules())
    missing = [m for m in modules if m not in named]
    if missing:
        raise LoraMismatch(f"{what} targets {len(missing)} module(s) this model does not have "
                           f"(e.g. {missing[0]}): a LoRA of another family or model")
    for name, (a, b, _) in modules.items():
        module = named[name]
        if isinstance(module, torch.nn.Conv2d):
            problem = lora_conv.fits(module, a, b)
            if problem is not None:
                raise LoraMismatch(f"{what} does not fit {name}: {problem}")
            continue
        if not isinstance(module, torch.nn.Linear):
            raise LoraMismatch(f"{what} targets {name}, a {type(module).__name__}: only Linear "
                               "and Conv2d layers take LoRAs here")
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != module.in_features or (
                b.shape[0] != module.out_features or a.shape[0] != b.shape[1]):
            raise LoraMismatch(
                f"{what} does not fit {name}: A {tuple(a.shape)}, B {tuple(b.shape)} for a "
                f"Linear {module.in_features} → {module.out_features}")


_CACHES: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _cache(owner: Any) -> Any:
    """The LoRA weights read for `owner` (a base module), by file sha256: they go when it goes
    (the model cache's base models are not evicted by LoRAs); the last INLINE_LORA_CACHE_SIZE
    (32) of each."""
    from workers.models.cache import ModelCache

    with _HOOKED_LOCK:
        cache = _CACHES.get(owner)
        if cache is None:
            cache = _CACHES[owner] = ModelCache(max(1, LORA_CACHE_SIZE))
    return cache


def lora_for(family_plugin: Any, path: Path, sha256: str, transformer: Any) -> LoraWeights:
    """`read_lora`, cached per base denoiser by the file's content sha256."""
    return _cache(transformer).get_or_load(
        sha256, lambda: read_lora(family_plugin, path, sha256, transformer))


def read_lora(family_plugin: Any, path: Path, sha256: str, transformer: Any) -> LoraWeights:
    """The LoRA file at `path` for `transformer` (checked, on its device and dtype, hooks
    installed; no module when the file has only text-encoder weights). LoraMismatch when it
    does not fit."""
    with _unreadable(path):
        modules = family_plugin.lora_state_dict(path, transformer)
    return _applied(transformer, modules, path, sha256, transformer.device, transformer.dtype)


def encoder_lora_for(family_plugin: Any, path: Path, sha256: str, encoder: Any,
                     denoiser: Any) -> LoraWeights:
    """The text-encoder half of the LoRA file at `path` for the family's text encoder(s)
    `encoder` (a TextEncoder; `denoiser`: the model the LoRA's other half goes on, whose
    config some converters read), cached per base encoder by sha256: checked, on the
    encoder's device and dtype, hooks installed; no module when the file has none."""
    import torch

    parts = family_plugin.text_encoder_parts(encoder)  # {"text_encoder": module, …}
    owner = next(iter(parts.values()))

    def read() -> LoraWeights:
        with _unreadable(path):
            modules = family_plugin.text_encoder_lora_state_dict(path, encoder, denoiser)
        root = torch.nn.ModuleDict(parts)  # names "text_encoder.<module>" as the converters'
        dtype = next(owner.parameters()).dtype
        return _applied(root, modules, path, sha256, encoder.placement.device, dtype)

    return _cache(owner).get_or_load(sha256, read)


@contextmanager
def _unreadable(path: Path) -> Iterator[None]:
    try:
        yield
    except LoraMismatch:
        raise
    except (ValueError, KeyError) as exc:  # diffusers' converters reject foreign keys so
        detail = " ".join(str(exc).split())[:300]
        raise LoraMismatch(f"loras/{path.name} is not a LoRA this family reads: {detail}") from exc


def _applied(root: Any, modules: dict[str, tuple[Tensor, Tensor, float]], path: Path,
             sha256: str, device: Any, dtype: Any) -> LoraWeights:
    """`modules` checked against `root`, on `device` / `dtype`, with `root`'s hooks."""
    check_fit(root, modules, f"loras/{path.name}")
    from workers.counters import count

    if modules:
        count("lora_loads")
    weights = LoraWeights(path.name, sha256, {
        name: (a.to(device=device, dtype=dtype).contiguous(),
               b.to(device=device, dtype=dtype).contiguous(), float(scale))
        for name, (a, b, scale) in modules.items()})
    install_hooks(root, weights)
    return weights


def encode_rows(encode: Any, encoder: Any, items: Sequence[tuple[str, tuple[AppliedLora, ...]]]
                ) -> list[Any]:
    """`encode(encoder, texts)` (a family's `encode_prompts`) over `(text, its encoder's
    LoRAs)` items: each text's rows carry its own LoRAs (one forward for every LoRA set)."""
    with rows([loras for _, loras in items]):
        return list(encode(encoder, [text for text, _ in items]))


# kohya `lora_te_` / `lora_te1_` / `lora_te2_`, diffusers `text_encoder[_2].`, ComfyUI
# `text_encoders.`, and the `te.` / `te1.` / `te2.` some trainers write
TEXT_ENCODER_PREFIXES = ("lora_te", "text_encoder", "te.", "te1.", "te2.")


def text_encoder_keys(path: Path) -> list[str]:
    """The keys of a LoRA file that are text-encoder weights (kohya `lora_te*_`, diffusers
    `text_encoder*.`, ComfyUI `text_encoders.`), read from its header only."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return [k for k in f.keys() if k.startswith(TEXT_ENCODER_PREFIXES)]  # noqa: SIM118 (safe_open is no dict)


def encoder_modules(state: dict[str, Tensor], alphas: dict[str, Any] | None, prefix: str,
                    part: Any) -> dict[str, tuple[Tensor, Tensor, float]]:
    """{"<prefix>.<module>": (A, B, alpha / r)} of the `<prefix>.` keys (a text encoder's, e.g.
    `text_encoder_2`) of a diffusers LoRA state dict for the transformers encoder `part`,
    converted as diffusers' `_load_lora_into_text_encoder` converts them (old diffusers names
    → PEFT; no `text_model.` level in a flattened CLIPTextModel); each module's alpha is its
    down weight's (`<prefix>.<key>.alpha`, kohya's per-module alpha; none: scale 1)."""
    from diffusers.utils.state_dict_utils import (
        convert_state_dict_to_diffusers,
        convert_state_dict_to_peft,
    )

    own = {k.removeprefix(f"{prefix}."): v for k, v in state.items() if k.startswith(f"{prefix}.")}
    if not own:
        return {}
    # the converters rename keys only: convert the keys themselves to know each one's origin
    origin = convert_state_dict_to_peft(convert_state_dict_to_diffusers({k: k for k in own}))
    flat = not hasattr(part, "text_model")

    def name(key: str) -> str:
        return key.removeprefix("text_model.") if flat else key

    renamed = {name(new): old for new, old in origin.items()}
    modules = peft_modules({new: own[old] for new, old in renamed.items()}, None, "")
    out: dict[str, tuple[Tensor, Tensor, float]] = {}
    for module, (a, b, scale) in modules.items():
        alpha = (alphas or {}).get(f"{prefix}.{renamed[f'{module}.lora_A.weight']}.alpha")
        out[f"{prefix}.{module}"] = (a, b, scale if alpha is None else float(alpha) / a.shape[0])
    return out


def pipeline_lora_modules(pipeline: Any, path: Path) -> dict[str, tuple[Tensor, Tensor, float]]:
    """{transformer module: (A, B, scale)} of a LoRA file in any format the diffusers
    `pipeline` class's `lora_state_dict` reads (its converters: ComfyUI `diffusion_model.`,
    kohya, AI-Toolkit, diffusers / PEFT; alphas as diffusers applies them), local files only.
    Text-encoder weights are left out. The families whose LoRAs diffusers reads share this."""
    state = {k: v for k, v in pipeline.lora_state_dict(str(path), local_files_only=True).items()
             if not k.startswith(TEXT_ENCODER_PREFIXES)}
    if not any(k.startswith("transformer.") for k in state):
        state = {f"transformer.{k}": v for k, v in state.items()}  # bare module names
    return peft_modules(state, None, "transformer.")


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


def random_lora(targets: dict[str, tuple[int, int]], generator: Any, *, prefix: str = "",
                rank: int = 4, scale: float = 0.3, alpha: float | None = None,
                names: tuple[str, str] = ("lora_A", "lora_B")) -> dict[str, Tensor]:
    """A random LoRA state dict for the tiny stacks: per `<prefix><module>` of `targets`
    ({module: (in, out)}, in order) a down [rank, in] then an up [out, rank] weight, drawn from
    `generator` and scaled by `scale`, under `names` (PEFT's lora_A / lora_B, or kohya's
    lora_down / lora_up), and its `.alpha` when given."""
    import torch

    down, up = names
    state: dict[str, Tensor] = {}
    for module, (fan_in, fan_out) in targets.items():
        key = f"{prefix}{module}"
        state[f"{key}.{down}.weight"] = torch.randn(rank, fan_in, generator=generator) * scale
        state[f"{key}.{up}.weight"] = torch.randn(fan_out, rank, generator=generator) * scale
        if alpha is not None:
            state[f"{key}.alpha"] = torch.tensor(alpha)
    return state


def save_lora(models_dir: Path, name: str, state: dict[str, Tensor]) -> str:
    """`state` as `loras/<name>` in `models_dir`; returns the name."""
    from safetensors.torch import save_file

    (Path(models_dir) / "loras").mkdir(parents=True, exist_ok=True)
    save_file(state, Path(models_dir) / "loras" / name)
    return name


def random_clip_lora(prefix: str, width: int, ffn: int, layers: Sequence[int], generator: Any,
                     rank: int = 4, alpha: float = 2.0) -> dict[str, Tensor]:
    """A random kohya LoRA of a CLIP text encoder's attention and MLP Linears (`<prefix>`
    `lora_te1` / `lora_te2`: `lora_te1_text_model_encoder_layers_0_self_attn_q_proj.lora_down.
    weight`, …), as kohya's trainers write them: the tiny stacks' text-encoder halves."""
    shapes = {"self_attn_q_proj": (width, width), "self_attn_v_proj": (width, width),
              "self_attn_out_proj": (width, width), "mlp_fc1": (width, ffn),
              "mlp_fc2": (ffn, width)}
    state: dict[str, Tensor] = {}
    for layer in layers:
        state |= random_lora(shapes, generator, prefix=f"{prefix}_text_model_encoder_layers_"
                             f"{layer}_", rank=rank, alpha=alpha,
                             names=("lora_down", "lora_up"))
    return state
