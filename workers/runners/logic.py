"""Runners for the values computed at run time, the lazy switch and the value preview
(descriptors in apps/graphs/nodes_logic.py). A wired param arrives in `params` already checked
against its limits (the executor substitutes it), so these read `params` only."""

from __future__ import annotations

import math
from typing import Any

from apps.graphs.descriptors import PORT_KINDS
from apps.graphs.mathexpr import NAMES, ExpressionError, expression_evaluate
from apps.graphs.nodes_logic import ASPECT_RATIOS
from workers.runners.base import NodeContext, NodeFailed, chooser, runner


@runner("input/bool")
def input_bool(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
    return {"value": bool(params["value"])}


@runner("text/concat")
def text_concat(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
    return {"text": params["delimiter"].join((params["string_a"], params["string_b"]))}


# ComfyUI's CameraAngle terms (its comfy_extras node, "Compose Camera Angle Prompt"): 8 azimuth sectors of 45°
# from the front, clockwise; elevation and distance buckets as (upper bound, term).
HORIZONTAL_TERMS = (
    "front view", "front-right quarter view", "right side view", "back-right quarter view",
    "back view", "back-left quarter view", "left side view", "front-left quarter view",
)
VERTICAL_TERMS = ((-15, "low-angle shot"), (15, "eye-level shot"), (45, "elevated shot"),
                  (None, "high-angle shot"))
DISTANCE_TERMS = ((2, "wide shot"), (6, "medium shot"), (None, "close-up"))


def _bucket(value: float, terms: tuple[tuple[int | None, str], ...]) -> str:
    """The first term whose upper bound is above the value (the last has none)."""
    return next(term for upper, term in terms if upper is None or value < upper)


def camera_angle_prompt(horizontal_angle: int, vertical_angle: int, zoom: float) -> str:
    """ComfyUI's CameraAngle prompt: azimuth, elevation and distance terms, space-joined. The
    azimuth's sector is centred on its term (front is 337.5°…22.5°)."""
    sector = int(((horizontal_angle % 360) + 22.5) // 45) % len(HORIZONTAL_TERMS)
    return " ".join((HORIZONTAL_TERMS[sector], _bucket(vertical_angle, VERTICAL_TERMS),
                     _bucket(zoom, DISTANCE_TERMS)))


@runner("text/camera-angle")
def camera_angle(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
    return {"prompt": camera_angle_prompt(params["horizontal_angle"], params["vertical_angle"],
                                          params["zoom"])}


@runner("math/expression")
def math_expression(
    ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]
) -> dict[str, Any]:
    """ComfyUI's outputs: the result as a float, int() of it (truncated) and bool() of it."""
    names = {name: inputs[name] for name in NAMES if name in inputs}
    try:
        result = expression_evaluate(params["expression"], names)
        as_float = float(result)
    except ExpressionError as exc:
        raise NodeFailed(f"expression {params['expression']!r}: {exc}") from None
    except OverflowError:
        raise NodeFailed(f"expression {params['expression']!r}: the result is too large for a "
                         "float") from None
    if not math.isfinite(as_float):
        raise NodeFailed(f"expression {params['expression']!r}: the result is {as_float}")
    return {"float": as_float, "int": int(result), "bool": bool(result)}


@runner("image/size")
def image_size(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
    image = inputs["image"]
    return {"width": image.width, "height": image.height, "batch_size": 1}


@runner("util/resolution")
def resolution(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
    """ComfyUI's ResolutionSelector, to the digit: each side rounded to `multiple`; below
    `minimum`, the smallest exact multiple of the ratio whose sides reach it."""
    w_ratio, h_ratio = ASPECT_RATIOS[params["aspect_ratio"]]
    multiple, minimum = params["multiple"], params["minimum"]
    scale = math.sqrt(params["megapixels"] * 1024 * 1024 / (w_ratio * h_ratio))
    width = round(w_ratio * scale / multiple) * multiple
    height = round(h_ratio * scale / multiple) * multiple
    if width < minimum or height < minimum:
        step_w = multiple // math.gcd(w_ratio, multiple)
        step_h = multiple // math.gcd(h_ratio, multiple)
        k_step = step_w * step_h // math.gcd(step_w, step_h)
        k = math.ceil(math.ceil(max(minimum / w_ratio, minimum / h_ratio)) / k_step) * k_step
        width, height = w_ratio * k, h_ratio * k
    return {"width": width, "height": height}


@runner("util/preview")
def preview(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
    ctx.show_value(inputs["source"])
    return {}


def _switch_choose(params: dict[str, Any], inputs: dict[str, Any]) -> frozenset[str]:
    return frozenset({"on_true" if params["switch"] else "on_false"})


def _switch_run(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
    chosen = "on_true" if params["switch"] else "on_false"
    if chosen not in inputs:
        raise NodeFailed(f"switch is {bool(params['switch'])}, and {chosen} is not connected")
    return {"output": inputs[chosen]}


for _kind in sorted(PORT_KINDS):
    runner(f"switch/{_kind}")(_switch_run)
    chooser(f"switch/{_kind}")(_switch_choose)
