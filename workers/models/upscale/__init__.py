"""Upscale models (`upscale_models/`): which architecture a file holds, read from its tensor
names and shapes alone. TORCH-FREE (the catalog's scan and the web side read it).

What ComfyUI loads through spandrel, written here without it (spandrel needs torchvision, which
cannot sit beside the farm's torch). Two architectures, each checked key by key and shape by
shape, so a file that passes loads without surprises:

- `esrgan`: RRDBNet — ESRGAN and Real-ESRGAN (x1, x2, x4, x8). Three key layouts, one net:
  the new one (`conv_first`, `body.N.rdbR.convC`, `conv_body`, `conv_upK`, `conv_hr`,
  `conv_last`), the older BasicSR one (`RRDB_trunk.N.RDBR.convC`, `trunk_conv`, `upconvK`,
  `HRconv`) and the original ESRGAN one (`model.0`, `model.1.sub.N.RDBR.convC.0`,
  `model.1.sub.<nb>`, then `model.<k>`: the up-convolutions, HR conv and last conv in order).
  Real-ESRGAN x2 / x1 pixel-unshuffle the input by 2 / 4: their first conv reads 4 / 16 times
  the output's channels.
- `compact`: SRVGGNetCompact (realesr-general-x4v3, realesr-animevideov3): `body.N` convs with
  PReLUs between them, a pixel shuffle, plus the nearest-upscaled input.

Where the farm differs from spandrel: other architectures (SwinIR, HAT, DAT, OmniSR, ESRGAN+'s
1×1 convs, 2×2-conv ESRGANs, …) are refused by name rather than loaded.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

ARCHITECTURES = ("esrgan", "compact")
KNOWN = "ESRGAN / Real-ESRGAN (RRDBNet) or SRVGGNetCompact"
ROLE = "upscaler"  # the catalog's role of a recognised upscale model file
# Wrappers that trainers save the weights under (BasicSR's EMA copy first, as spandrel reads).
WRAPPERS = ("params_ema", "params-ema", "params", "model", "net", "state_dict")

Shapes = dict[str, tuple[int, ...]]


class NotAnUpscaler(ValueError):
    """The weights are no upscale architecture this farm runs; the message says why."""


@dataclass(frozen=True)
class UpscaleSpec:
    """An upscale net's hyper-parameters, as read from its weights.

    esrgan: `features` nf, `blocks` nb RRDBs of `growth` gc channels, `upsamples` ×2 nearest +
    conv stages, input pixel-unshuffled by `unshuffle` (1, 2, 4). compact: `features` channels,
    `blocks` body convs, one pixel shuffle by `scale`.
    """

    arch: str
    scale: int
    in_channels: int
    out_channels: int
    features: int
    blocks: int
    growth: int = 0
    upsamples: int = 0
    unshuffle: int = 1

    @property
    def multiple(self) -> int:
        """Input sides must be multiples of this (the pixel unshuffle's factor)."""
        return self.unshuffle


def unwrap(state: dict[str, object]) -> dict[str, object]:
    """The weights of a saved dict: inside BasicSR's `params_ema` (or another wrapper), with
    DataParallel's `module.` prefix dropped."""
    for _ in range(2):
        inner = next((state[k] for k in WRAPPERS if isinstance(state.get(k), dict)), None)
        if inner is None:
            break
        state = inner  # type: ignore[assignment]
    if state and all(k.startswith("module.") for k in state):
        state = {k[len("module."):]: v for k, v in state.items()}
    return state


def recognise(shapes: Shapes) -> UpscaleSpec:
    """The spec of the upscale net whose tensors have `shapes` (keys as saved: any ESRGAN
    layout). Raises NotAnUpscaler saying what is missing or unexpected."""
    if any(_RDB.match(k) or _RDB_OLD.match(k) for k in shapes) or "model.0.weight" in shapes \
            or "conv_first.weight" in shapes:
        return _esrgan(shapes)
    if "body.0.weight" in shapes and all(_COMPACT.match(k) for k in shapes):
        return _compact(shapes)
    sample = ", ".join(sorted(shapes)[:4]) or "no tensors"
    raise NotAnUpscaler(f"its weights are no upscale architecture this farm runs ({KNOWN}); "
                        f"its keys start {sample}")


# --- ESRGAN / Real-ESRGAN ----------------------------------------------------------------------

_RDB = re.compile(r"^(?:body|RRDB_trunk)\.(\d+)\.(?:rdb|RDB)([123])\.conv([1-5])\.(weight|bias)$")
_RDB_OLD = re.compile(r"^model\.1\.sub\.(\d+)\.RDB([123])\.conv([1-5])\.0\.(weight|bias)$")
_TRUNK_OLD = re.compile(r"^model\.1\.sub\.(\d+)\.(weight|bias)$")
_SEQ_OLD = re.compile(r"^model\.(\d+)\.(weight|bias)$")
_UP = re.compile(r"^(?:upconv|conv_up)(\d+)\.(weight|bias)$")
_RENAMED = {"trunk_conv": "conv_body", "HRconv": "conv_hr"}


def esrgan_names(keys: list[str]) -> dict[str, str]:
    """Saved key → the new-layout name (`conv_first`, `body.N.rdbR.convC`, `conv_body`,
    `conv_upK`, `conv_hr`, `conv_last`), for any of the three layouts; keys it cannot place map
    to themselves (the shape check refuses them)."""
    names: dict[str, str] = {}
    trunk = [int(m.group(1)) for k in keys if (m := _TRUNK_OLD.match(k))]
    tail = sorted({int(m.group(1)) for k in keys if (m := _SEQ_OLD.match(k)) and int(m.group(1)) > 1})
    # the original layout's tail: model.<k> up-convs in order, then the HR conv, then the last
    tail_names = {k: f"conv_up{i + 1}" for i, k in enumerate(tail[:-2])}
    if len(tail) >= 2:
        tail_names.update({tail[-2]: "conv_hr", tail[-1]: "conv_last"})
    for key in keys:
        if m := _RDB.match(key) or _RDB_OLD.match(key):
            names[key] = f"body.{m.group(1)}.rdb{m.group(2)}.conv{m.group(3)}.{m.group(4)}"
        elif (m := _TRUNK_OLD.match(key)) and int(m.group(1)) == max(trunk):
            names[key] = f"conv_body.{m.group(2)}"
        elif (m := _SEQ_OLD.match(key)) and int(m.group(1)) in (0, *tail_names):
            index = int(m.group(1))
            names[key] = f"{'conv_first' if index == 0 else tail_names[index]}.{m.group(2)}"
        elif m := _UP.match(key):
            names[key] = f"conv_up{m.group(1)}.{m.group(2)}"
        else:
            stem, _, kind = key.rpartition(".")
            names[key] = f"{_RENAMED.get(stem, stem)}.{kind}"
    return names


def _esrgan(saved: Shapes) -> UpscaleSpec:
    shapes = {esrgan_names(list(saved))[k]: s for k, s in saved.items()}
    first, last = _conv(shapes, "conv_first"), _conv(shapes, "conv_last")
    nf, first_in, out = first[0], first[1], last[0]
    blocks = sorted({int(k.split(".")[1]) for k in shapes if k.startswith("body.")})
    if not blocks or blocks != list(range(len(blocks))):
        raise NotAnUpscaler(f"its RRDB blocks are not numbered 0…n (found {blocks[:5]})")
    gc = _conv(shapes, "body.0.rdb1.conv1")[0]
    ups = sum(1 for k in shapes if k.startswith("conv_up") and k.endswith(".weight"))
    unshuffle = next((f for f in (2, 4) if first_in == out * f * f), 1)
    expected = _esrgan_shapes(nf, first_in, out, gc, len(blocks), ups)
    _check(shapes, expected, "ESRGAN")
    scale = 2**ups // unshuffle
    if scale < 1 or 2**ups % unshuffle:
        raise NotAnUpscaler(f"{ups} up-convolutions and a pixel unshuffle by {unshuffle} make "
                            "no whole scale")
    return UpscaleSpec("esrgan", scale, first_in // (unshuffle * unshuffle), out, nf,
                       len(blocks), gc, ups, unshuffle)


def _esrgan_shapes(nf: int, first_in: int, out: int, gc: int, nb: int, ups: int) -> Shapes:
    shapes: Shapes = {}

    def conv(name: str, c_out: int, c_in: int) -> None:
        shapes[f"{name}.weight"], shapes[f"{name}.bias"] = (c_out, c_in, 3, 3), (c_out,)

    conv("conv_first", nf, first_in)
    for n in range(nb):
        for r in (1, 2, 3):
            for c in range(1, 6):
                conv(f"body.{n}.rdb{r}.conv{c}", nf if c == 5 else gc, nf + (c - 1) * gc)
    conv("conv_body", nf, nf)
    for k in range(1, ups + 1):
        conv(f"conv_up{k}", nf, nf)
    conv("conv_hr", nf, nf)
    conv("conv_last", out, nf)
    return shapes


# --- SRVGGNetCompact ---------------------------------------------------------------------------

_COMPACT = re.compile(r"^body\.(\d+)\.(weight|bias)$")


def _compact(shapes: Shapes) -> UpscaleSpec:
    highest = max(int(m.group(1)) for k in shapes if (m := _COMPACT.match(k)))
    first = _conv(shapes, "body.0")
    nf, in_ch = first[0], first[1]
    convs = (highest - 2) // 2
    last_out = _conv(shapes, f"body.{highest}")[0]
    scale = math.isqrt(last_out // in_ch) if last_out % in_ch == 0 else 0
    expected: Shapes = {}
    for index in range(highest + 1):
        if index % 2:  # a PReLU: one slope per channel
            expected[f"body.{index}.weight"] = (nf,)
        else:
            c_out = last_out if index == highest else nf
            expected[f"body.{index}.weight"] = (c_out, in_ch if index == 0 else nf, 3, 3)
            expected[f"body.{index}.bias"] = (c_out,)
    _check(shapes, expected, "SRVGGNetCompact")
    if highest % 2 or convs < 0 or scale < 1 or scale * scale * in_ch != last_out:
        raise NotAnUpscaler(f"its last conv gives {last_out} channels: no pixel shuffle of "
                            f"{in_ch}-channel images")
    return UpscaleSpec("compact", scale, in_ch, in_ch, nf, convs)


# --- shared ------------------------------------------------------------------------------------


def _conv(shapes: Shapes, name: str) -> tuple[int, ...]:
    shape = shapes.get(f"{name}.weight")
    if shape is None or len(shape) != 4:
        raise NotAnUpscaler(f"it has no 3×3 convolution {name!r} ({KNOWN} weights have one)")
    return shape


def _check(shapes: Shapes, expected: Shapes, arch: str) -> None:
    missing = sorted(set(expected) - set(shapes))
    extra = sorted(set(shapes) - set(expected))
    wrong = sorted(k for k in set(expected) & set(shapes) if tuple(shapes[k]) != expected[k])
    for what, keys in (("lacks", missing), ("has unexpected", extra), ("has misshapen", wrong)):
        if keys:
            raise NotAnUpscaler(f"it looks like {arch} but {what} weights ({', '.join(keys[:3])}"
                                f"{', …' if len(keys) > 3 else ''}); a variant this farm does "
                                "not run")
