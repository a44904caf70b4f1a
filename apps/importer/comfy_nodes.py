"""What the importer knows about ComfyUI node types, as tables. TORCH-FREE.

Two tables carry the knowledge:
- `WIDGETS`: the positional order of each type's widgets, as the UI format saves them in
  `widgets_values` (ComfyUI's INPUT_TYPES order, minus the link inputs; `CONTROL` marks the
  extra `control_after_generate` value the UI saves after a seed widget).
- `RULES`: how a ComfyUI type becomes one of our node types: link inputs → our input ports,
  output slots → our output ports, widgets → our params (with a converter), and checks that
  report what our node cannot honour.
Types that are folded away (`FOLDED`, `CUT`), UI-only (`UI_ONLY`) or known to be unsupported
(`UNSUPPORTED`) are listed with the reason the report gives.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from apps.graphs.descriptors import VALUE_KINDS
from apps.graphs.mathexpr import NAMES as MATH_NAMES
from apps.graphs.nodes import MAX_SEED

CONTROL = "control_after_generate"
CONTROL_VALUES = frozenset({"fixed", "increment", "decrement", "randomize"})

WIDGETS: dict[str, tuple[str, ...]] = {
    "CheckpointLoaderSimple": ("ckpt_name",),
    "UNETLoader": ("unet_name", "weight_dtype"),
    "CLIPLoader": ("clip_name", "type", "device"),
    "DualCLIPLoader": ("clip_name1", "clip_name2", "type", "device"),
    "VAELoader": ("vae_name",),
    "LoraLoaderModelOnly": ("lora_name", "strength_model"),
    "CLIPTextEncode": ("text",),
    "ConditioningZeroOut": (),
    "EmptyLatentImage": ("width", "height", "batch_size"),
    "EmptySD3LatentImage": ("width", "height", "batch_size"),
    "KSampler": ("seed", CONTROL, "steps", "cfg", "sampler_name", "scheduler", "denoise"),
    "KSamplerAdvanced": (
        "add_noise", "noise_seed", CONTROL, "steps", "cfg", "sampler_name", "scheduler",
        "start_at_step", "end_at_step", "return_with_leftover_noise",
    ),
    "ModelSamplingAuraFlow": ("shift",),
    "VAEDecode": (),
    "VAEEncode": (),
    "SaveImage": ("filename_prefix",),
    "PreviewImage": (),
    "LoadImage": ("image", "upload"),
    "ImageScale": ("upscale_method", "width", "height", "crop"),
    "ImageScaleBy": ("upscale_method", "scale_by"),
    "ImageCrop": ("width", "height", "x", "y"),
    "PrimitiveInt": ("value", CONTROL),
    "PrimitiveFloat": ("value",),
    "PrimitiveString": ("value",),
    "PrimitiveStringMultiline": ("value",),
    "PrimitiveNode": ("value", CONTROL),
    "PrimitiveBoolean": ("value",),
    "StringConcatenate": ("string_a", "string_b", "delimiter"),
    "ComfyMathExpression": ("expression",),
    "GetImageSize": (),
    "ResolutionSelector": ("aspect_ratio", "megapixels", "multiple", "minimum"),
    "ComfySwitchNode": ("switch",),
    "PreviewAny": (),
    "ImageScaleToTotalPixels": ("upscale_method", "megapixels", "resolution_steps"),
    "ImageInvert": (),
    "ImageCompositeMasked": ("x", "y", "resize_source"),
    "ImageToMask": ("channel",),
    "MaskToImage": (),
    "ImagePadForOutpaint": ("left", "top", "right", "bottom", "feathering"),
    "SaveImageAdvanced": ("filename_prefix", "format"),  # the UI format: DYNAMIC_WIDGETS
    "ResizeAndPadImage": ("target_width", "target_height", "padding_color", "interpolation"),
}

# Options of ComfyUI's dynamic combos: the widgets each option adds after the combo's own value
# (positional in the UI format; `<combo>.<widget>` in the API format).
RESIZE_OPTIONS: dict[str, tuple[str, ...]] = {
    "scale dimensions": ("width", "height", "crop"),
    "scale by multiplier": ("multiplier",),
    "scale longer dimension": ("longer_size",),
    "scale shorter dimension": ("shorter_size",),
    "scale width": ("width",),
    "scale height": ("height",),
    "scale total pixels": ("megapixels",),
    "match size": ("crop",),
    "scale to multiple": ("multiple",),
}


def _resize_widgets(values: list[Any]) -> dict[str, Any]:
    """ResizeImageMaskNode: [resize_type, its option's widgets…, scale_method]."""
    if not values:
        return {}
    option = RESIZE_OPTIONS.get(str(values[0]), ())
    named = {"resize_type": values[0]}
    named.update({f"resize_type.{w}": v for w, v in zip(option, values[1:], strict=False)})
    if len(values) > len(option) + 1:
        named["scale_method"] = values[len(option) + 1]
    return named


def _save_advanced_widgets(values: list[Any]) -> dict[str, Any]:
    """SaveImageAdvanced: [filename_prefix, format, bit_depth, color space, …]."""
    names = ("filename_prefix", "format", "format.bit_depth", "format.input_color_space")
    return dict(zip(names, values, strict=False))


# Types whose widgets_values depend on a dynamic combo's option: read by these, not WIDGETS.
DYNAMIC_WIDGETS: dict[str, Callable[[list[Any]], dict[str, Any]]] = {
    "ResizeImageMaskNode": _resize_widgets,
    "SaveImageAdvanced": _save_advanced_widgets,
}

# UI-only node types: never sent to ComfyUI's backend; the UI reader resolves them.
NOTE_TYPES = frozenset({"Note", "MarkdownNote"})
REROUTE = "Reroute"
PRIMITIVE_NODE = "PrimitiveNode"
UI_ONLY = NOTE_TYPES | {REROUTE, PRIMITIVE_NODE}

# Our sampler is Z-Image Turbo's flow-matching Euler on its own sigma schedule (shift 3).
OUR_SAMPLERS = frozenset({"euler"})
OUR_SCHEDULERS = frozenset({"simple", "normal"})
OUR_SHIFT = 3.0
RESAMPLE = {"nearest-exact": "nearest", "bilinear": "bilinear", "area": "bilinear",
            "bicubic": "bicubic", "lanczos": "lanczos"}

Warn = Callable[[dict[str, Any]], list[str]]
# The kind (our port kind) of what feeds a ComfyUI input of the node being mapped, or None.
KindOf = Callable[[str], str | None]


@dataclass(frozen=True)
class ParamMap:
    """A ComfyUI widget → one of our params. `folder`: a model param resolved in that folder."""

    name: str
    convert: Callable[[Any], Any] = lambda v: v
    folder: str | None = None


@dataclass(frozen=True)
class Rule:
    """How one ComfyUI type becomes one of our node types."""

    type: str
    inputs: dict[str, str] = field(default_factory=dict)
    outputs: tuple[str | None, ...] = ()
    params: dict[str, ParamMap] = field(default_factory=dict)
    warnings: tuple[Warn, ...] = ()
    derive: Callable[[dict[str, Any]], dict[str, Any]] | None = None  # params from several widgets
    refuse: Callable[[dict[str, Any]], str | None] | None = None  # a reason it cannot map here
    # The rule that really applies, from the widgets and the kinds that feed the inputs (a
    # switch's type follows its branches, a resize its mode); a string is why none does.
    pick: Callable[[dict[str, Any], KindOf], Rule | str] | None = None


# --- converters and checks --------------------------------------------------------------------


def cfg_to_guidance(cfg: Any) -> float:
    """ComfyUI mixes `uncond + cfg·(cond − uncond)`; Z-Image's guidance g mixes
    `cond + g·(cond − uncond)`: the same prediction when g = cfg − 1 (cfg 1 = no CFG)."""
    return max(0.0, float(cfg) - 1.0)


def _seed(seed: Any) -> Any:
    """ComfyUI seeds go to 2⁶⁴−1; ours stop at 2⁵³−1 (exact in JSON clients): wrap around
    (`_seed_range` warns). The noise differs from ComfyUI's anyway, so no image is lost."""
    return seed % (MAX_SEED + 1) if isinstance(seed, int) and seed > MAX_SEED else seed


def _seed_range(values: dict[str, Any]) -> list[str]:
    seed = values.get("seed", values.get("noise_seed"))
    if isinstance(seed, int) and not isinstance(seed, bool) and seed > MAX_SEED:
        return [f"seed {seed} is above 2^53-1: it is used modulo 2^53 ({_seed(seed)})"]
    return []


def _resample(method: Any) -> Any:
    return RESAMPLE.get(str(method), method)


def _differs(widget: str, expected: Any, why: str) -> Warn:
    def check(values: dict[str, Any]) -> list[str]:
        value = values.get(widget, expected)
        if isinstance(value, list) or value in (expected, None):
            return []
        return [f"{widget} {value!r} is ignored: {why}"]

    return check


def _sampler_names(values: dict[str, Any]) -> list[str]:
    found = []
    sampler, scheduler = values.get("sampler_name"), values.get("scheduler")
    if isinstance(sampler, str) and sampler not in OUR_SAMPLERS:
        found.append(f"sampler {sampler!r} is not on this farm: it samples with 'euler' "
                     "(flow matching)")
    if isinstance(scheduler, str) and scheduler not in OUR_SCHEDULERS:
        found.append(f"scheduler {scheduler!r} is not on this farm: it uses Z-Image's flow-match "
                     "schedule ('simple')")
    cfg = values.get("cfg")
    if isinstance(cfg, int | float) and cfg < 1:
        found.append(f"cfg {cfg} is below 1: guidance 0 (no CFG) is used")
    return found


def _advanced_denoise(values: dict[str, Any]) -> dict[str, Any]:
    """KSamplerAdvanced's start step → our `denoise` (the fraction of the schedule run)."""
    steps, start = values.get("steps"), values.get("start_at_step", 0)
    if isinstance(steps, int) and isinstance(start, int) and 0 < start < steps:
        return {"denoise": (steps - start) / steps}
    return {}


def _advanced_limits(values: dict[str, Any]) -> list[str]:
    found = []
    steps, end = values.get("steps"), values.get("end_at_step", 10000)
    if isinstance(steps, int) and isinstance(end, int) and end < steps:
        found.append(f"end_at_step {end} is ignored: the farm's sampler runs to the last step")
    if values.get("add_noise") == "disable":
        found.append("add_noise 'disable' is ignored: the farm's sampler always adds noise")
    if values.get("return_with_leftover_noise") == "enable":
        found.append("return_with_leftover_noise is ignored: the result is fully denoised")
    return found


def _area(values: dict[str, Any]) -> list[str]:
    if values.get("upscale_method") == "area":
        return ["upscale_method 'area' is approximated by 'bilinear'"]
    return []


def _shift(values: dict[str, Any]) -> list[str]:
    shift = values.get("shift")
    if isinstance(shift, int | float) and float(shift) != OUR_SHIFT:
        return [f"shift {shift} is ignored: the farm's Z-Image schedule uses shift 3"]
    return []


def _zero_sides(values: dict[str, Any]) -> str | None:
    if values.get("width") == 0 and values.get("height") == 0:
        return "both sides are 0: ComfyUI passes the image through unchanged; remove the node"
    return None


def _crop_fit(values: dict[str, Any]) -> dict[str, Any]:
    return {"fit": "crop" if values.get("crop") == "center" else "stretch"}


_RESIZE_PARAMS = {"upscale_method": ParamMap("method", _resample), "width": ParamMap("width"),
                  "height": ParamMap("height")}


def _image_scale_pick(values: dict[str, Any], kind_of: KindOf) -> Rule | str:
    """ImageScale with a side of 0 keeps the aspect: the other side decides (image/scale-side)."""
    if values.get("width") != 0 and values.get("height") != 0:
        return RULES["ImageScale"]
    other = "height" if values.get("width") == 0 else "width"
    return Rule("image/scale-side", inputs={"image": "image"}, outputs=("image",),
                params={"upscale_method": ParamMap("method", _resample), other: ParamMap("size")},
                derive=lambda v: {"side": other}, warnings=(_area,))


# --- the mapping ------------------------------------------------------------------------------

_SEED_AND_STEPS = {"steps": ParamMap("steps"), "cfg": ParamMap("guidance", cfg_to_guidance)}
_SAMPLER_INPUTS = {"model": "model", "positive": "positive", "negative": "negative",
                   "latent_image": "latent"}
_POLICY = "the farm's device policy chooses devices and dtypes"

RULES: dict[str, Rule] = {
    "UNETLoader": Rule(
        "load/diffusion-model", outputs=("model",),
        params={"unet_name": ParamMap("file", folder="diffusion_models")},
        warnings=(_differs("weight_dtype", "default", _POLICY),),
    ),
    "CLIPLoader": Rule(
        "load/text-encoder", outputs=("encoder",),
        params={"clip_name": ParamMap("file", folder="text_encoders")},
        warnings=(_differs("type", "lumina2", "the farm's text encoders are Z-Image's (Qwen3, "
                                              "ComfyUI type 'lumina2')"),
                  _differs("device", "default", _POLICY)),
    ),
    "DualCLIPLoader": Rule(  # FLUX.1's CLIP-L + T5: the family recognises each from its keys
        "load/text-encoder", outputs=("encoder",),
        params={"clip_name1": ParamMap("file", folder="text_encoders"),
                "clip_name2": ParamMap("file_2", folder="text_encoders")},
        warnings=(_differs("type", "flux", "the farm's two-encoder family is FLUX.1 (ComfyUI "
                                           "type 'flux')"),
                  _differs("device", "default", _POLICY)),
    ),
    "VAELoader": Rule(
        "load/vae", outputs=("vae",), params={"vae_name": ParamMap("file", folder="vae")},
    ),
    "CLIPTextEncode": Rule(
        "encode/text", inputs={"clip": "encoder"}, outputs=("conditioning",),
        params={"text": ParamMap("text")},
    ),
    "EmptyLatentImage": Rule(
        "latent/empty", outputs=("latent",),
        params={"width": ParamMap("width"), "height": ParamMap("height")},
        warnings=(_differs("batch_size", 1, "the farm renders one image per run"),),
    ),
    "KSampler": Rule(
        "sample", inputs=_SAMPLER_INPUTS, outputs=("latent",),
        params={"seed": ParamMap("seed", _seed), **_SEED_AND_STEPS,
                "denoise": ParamMap("denoise")},
        warnings=(_sampler_names, _seed_range),
    ),
    "KSamplerAdvanced": Rule(
        "sample", inputs=_SAMPLER_INPUTS, outputs=("latent",),
        params={"noise_seed": ParamMap("seed", _seed), **_SEED_AND_STEPS},
        warnings=(_sampler_names, _seed_range, _advanced_limits), derive=_advanced_denoise,
    ),
    "VAEDecode": Rule("vae/decode", inputs={"samples": "latent", "vae": "vae"}, outputs=("image",)),
    "VAEEncode": Rule("vae/encode", inputs={"pixels": "image", "vae": "vae"}, outputs=("latent",)),
    "SaveImage": Rule(
        "image/save", inputs={"images": "image"}, params={"filename_prefix": ParamMap("label")},
    ),
    "PreviewImage": Rule(
        "image/save", inputs={"images": "image"}, derive=lambda values: {"label": "preview"},
    ),
    "LoadImage": Rule(
        "image/load", outputs=("image", "mask"), params={"image": ParamMap("asset")},
    ),
    "ImageScale": Rule(
        "image/resize", inputs={"image": "image"}, outputs=("image",),
        params=_RESIZE_PARAMS, derive=_crop_fit, warnings=(_area,), refuse=_zero_sides,
        pick=_image_scale_pick,
    ),
    "ImageCrop": Rule(
        "image/crop", inputs={"image": "image"}, outputs=("image",),
        params={"width": ParamMap("width"), "height": ParamMap("height"), "x": ParamMap("x"),
                "y": ParamMap("y")},
    ),
    "PrimitiveInt": Rule("input/int", outputs=("value",), params={"value": ParamMap("value")}),
    "PrimitiveFloat": Rule("input/float", outputs=("value",), params={"value": ParamMap("value")}),
    "PrimitiveString": Rule("input/text", outputs=("text",), params={"value": ParamMap("value")}),
    "PrimitiveStringMultiline": Rule(
        "input/text", outputs=("text",), params={"value": ParamMap("value")},
    ),
}
RULES["EmptySD3LatentImage"] = RULES["EmptyLatentImage"]

# Folded into their consumers: output 0 is the named input, unchanged on this farm.
FOLDED: dict[str, tuple[str, str, Warn | None]] = {
    "ModelSamplingAuraFlow": (
        "model",
        "folded into the sampler: the farm's Z-Image schedule already uses shift 3",
        _shift,
    ),
}

# Cut: consumers get the input unwired, which means the same thing on this farm.
CUT: dict[str, str] = {
    "ConditioningZeroOut": (
        "the farm's sampler builds its own negative (unused at cfg 1, the empty prompt's "
        "otherwise): the sampler's negative input is left unwired"
    ),
}

UNSUPPORTED: dict[str, str] = {
    "CheckpointLoaderSimple": (
        "the farm loads the diffusion model, text encoder and VAE from separate files: use "
        "UNETLoader, CLIPLoader and VAELoader"
    ),
    "LoraLoaderModelOnly": "LoRAs are not runnable on this farm yet",
}


# --- ComfyUI's core vocabulary around the models: values, math, switch, image ops -------------


def _switch_pick(values: dict[str, Any], kind_of: KindOf) -> Rule | str:
    """ComfySwitchNode → switch/<kind>, the kind of whichever branch is connected."""
    kinds = {k for k in (kind_of("on_true"), kind_of("on_false")) if k is not None}
    if len(kinds) != 1:
        return ("its branches are not connected to nodes of one kind this farm maps"
                if not kinds else f"its branches give different kinds ({', '.join(sorted(kinds))})")
    kind = kinds.pop()
    return Rule(f"switch/{kind}", inputs={"switch": "switch", "on_false": "on_false",
                                           "on_true": "on_true"},
                outputs=("output",), params={"switch": ParamMap("switch", bool)})


def _preview_pick(values: dict[str, Any], kind_of: KindOf) -> Rule | str:
    kind = kind_of("source")
    if kind not in VALUE_KINDS:
        return (f"it previews {kind or 'unmapped'} values: the farm shows text, numbers and "
                "booleans (images: PreviewImage)")
    return RULES["PreviewAny"]


def _math_literals(values: dict[str, Any]) -> list[str]:
    found = []
    for name in MATH_NAMES:
        for key in (name, f"values.{name}"):
            value = values.get(key)
            if isinstance(value, int | float):  # a link is no number (api_format.Link)
                found.append(f"input {name!r} holds the value {value!r}, not a link: feed it from "
                             "a PrimitiveFloat / PrimitiveInt node (the farm reads inputs only)")
    return found


def _save_format(values: dict[str, Any]) -> dict[str, Any]:
    fmt = str(values.get("format", "png")).lower()
    fmt = "jpeg" if fmt == "jpg" else fmt
    found: dict[str, Any] = {"format": fmt if fmt in ("png", "webp", "jpeg") else "png"}
    quality = values.get("format.quality", values.get("quality"))
    if isinstance(quality, int) and not isinstance(quality, bool) and 1 <= quality <= 100:
        found["quality"] = quality
    return found


def _save_format_warnings(values: dict[str, Any]) -> list[str]:
    found = []
    fmt = str(values.get("format", "png")).lower()
    if fmt not in ("png", "webp", "jpeg", "jpg"):
        found.append(f"format {fmt!r} is not on this farm: the take is a PNG")
    depth = values.get("format.bit_depth")
    if isinstance(depth, str) and not depth.startswith("8"):
        found.append(f"bit_depth {depth!r} is ignored: takes are 8 bits per channel")
    space = values.get("format.input_color_space", values.get("format.color_space"))
    if isinstance(space, str) and space != "sRGB":
        found.append(f"color space {space!r} is ignored: takes are written as sRGB")
    if values.get("embed_workflow") is False:
        found.append("embed_workflow false is ignored: takes carry their generation parameters")
    return found


_SCALE = {"scale_method": ParamMap("method", _resample)}
_RESIZE_IN = {"input": "image"}


def _area_scale(values: dict[str, Any]) -> list[str]:
    return _area({"upscale_method": values.get("scale_method")})


def _resize_pick(values: dict[str, Any], kind_of: KindOf) -> Rule | str:
    """ResizeImageMaskNode's modes → our image nodes (masks are not resized here yet)."""
    if kind_of("input") == "mask":
        return "it resizes a mask: the farm resizes images only"
    mode = values.get("resize_type", "scale dimensions")
    w, h = values.get("resize_type.width"), values.get("resize_type.height")

    def side(name: str, size_widget: str) -> Rule:
        return Rule("image/scale-side", inputs=_RESIZE_IN, outputs=("image",),
                    params={**_SCALE, size_widget: ParamMap("size")},
                    derive=lambda v: {"side": name}, warnings=(_area_scale,))

    if mode == "scale dimensions" and w == 0 and h == 0:
        return "both sides are 0: ComfyUI passes the input through unchanged; remove the node"
    if mode == "scale width" or (mode == "scale dimensions" and h == 0):
        return side("width", "resize_type.width")
    if mode == "scale height" or (mode == "scale dimensions" and w == 0):
        return side("height", "resize_type.height")
    if mode == "scale dimensions":
        return Rule("image/resize", inputs=_RESIZE_IN, outputs=("image",),
                    params={**_SCALE, "resize_type.width": ParamMap("width"),
                            "resize_type.height": ParamMap("height")},
                    derive=lambda v: {"fit": "stretch" if v.get("resize_type.crop") == "disabled"
                                      else "crop"}, warnings=(_area_scale,))
    if mode in ("scale longer dimension", "scale shorter dimension"):
        which = mode.split()[1]
        return side(which, f"resize_type.{which}_size")
    if mode == "scale by multiplier":
        return Rule("image/scale-by", inputs=_RESIZE_IN, outputs=("image",),
                    params={**_SCALE, "resize_type.multiplier": ParamMap("scale_by")},
                    warnings=(_area_scale,))
    if mode == "scale total pixels":
        return Rule("image/scale-to-pixels", inputs=_RESIZE_IN, outputs=("image",),
                    params={**_SCALE, "resize_type.megapixels": ParamMap("megapixels")},
                    warnings=(_area_scale,))
    return f"resize_type {mode!r} has no equivalent on this farm yet"


_IMAGE_IN = {"image": "image"}

VOCABULARY: dict[str, Rule] = {
    "PrimitiveBoolean": Rule("input/bool", outputs=("value",),
                             params={"value": ParamMap("value", bool)}),
    "StringConcatenate": Rule(
        "text/concat", outputs=("text",),
        params={name: ParamMap(name) for name in ("string_a", "string_b", "delimiter")},
    ),
    "ComfyMathExpression": Rule(
        "math/expression",
        inputs={**{f"values.{n}": n for n in MATH_NAMES}, **{n: n for n in MATH_NAMES}},
        outputs=("float", "int", "bool"), params={"expression": ParamMap("expression")},
        warnings=(_math_literals,),
    ),
    "GetImageSize": Rule("image/size", inputs={"image": "image"},
                         outputs=("width", "height", "batch_size")),
    "ResolutionSelector": Rule(
        "util/resolution", outputs=("width", "height"),
        params={name: ParamMap(name) for name in ("aspect_ratio", "megapixels", "multiple",
                                                  "minimum")},
    ),
    "ComfySwitchNode": Rule(
        "switch/image", inputs={"switch": "switch", "on_false": "on_false", "on_true": "on_true"},
        outputs=("output",), params={"switch": ParamMap("switch", bool)}, pick=_switch_pick,
    ),
    "PreviewAny": Rule("util/preview", inputs={"source": "source"}, pick=_preview_pick),
    "SaveImageAdvanced": Rule(
        "image/save", inputs={"images": "image"}, params={"filename_prefix": ParamMap("label")},
        derive=_save_format, warnings=(_save_format_warnings,),
    ),
    "ImageScaleBy": Rule(
        "image/scale-by", inputs=_IMAGE_IN, outputs=("image",),
        params={"upscale_method": ParamMap("method", _resample), "scale_by": ParamMap("scale_by")},
        warnings=(_area,),
    ),
    "ImageScaleToTotalPixels": Rule(
        "image/scale-to-pixels", inputs=_IMAGE_IN, outputs=("image",),
        params={"upscale_method": ParamMap("method", _resample),
                "megapixels": ParamMap("megapixels"),
                "resolution_steps": ParamMap("resolution_steps")},
        warnings=(_area,),
    ),
    "ResizeImageMaskNode": Rule(
        "image/resize", inputs=_RESIZE_IN, outputs=("image",), pick=_resize_pick,
    ),
    "ResizeAndPadImage": Rule(
        "image/resize", inputs=_IMAGE_IN, outputs=("image",),
        params={"target_width": ParamMap("width"), "target_height": ParamMap("height"),
                "padding_color": ParamMap("pad_color"),
                "interpolation": ParamMap("method", _resample)},
        derive=lambda values: {"fit": "pad"},
        warnings=(lambda v: _area({"upscale_method": v.get("interpolation")}),),
    ),
    "ImageInvert": Rule("image/invert", inputs=_IMAGE_IN, outputs=("image",)),
    "ImageCompositeMasked": Rule(
        "image/composite", inputs={"destination": "destination", "source": "source",
                                   "mask": "mask"}, outputs=("image",),
        params={name: ParamMap(name) for name in ("x", "y", "resize_source")},
    ),
    "ImageToMask": Rule("mask/from-image", inputs={"image": "image"}, outputs=("mask",),
                        params={"channel": ParamMap("channel")}),
    "MaskToImage": Rule("mask/to-image", inputs={"mask": "mask"}, outputs=("image",)),
    "ImagePadForOutpaint": Rule(
        "image/pad-outpaint", inputs=_IMAGE_IN, outputs=("image", "mask"),
        params={name: ParamMap(name) for name in ("left", "top", "right", "bottom",
                                                  "feathering")},
    ),
}
RULES.update(VOCABULARY)
