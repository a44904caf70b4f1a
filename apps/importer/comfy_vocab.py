"""The importer's rules for ComfyUI's core vocabulary around the models: values, math, the
switch, previews, image and mask ops, SaveImageAdvanced, upscale models, video (comfy_nodes.py merges
them into its tables). TORCH-FREE.

A rule with `pick` is settled per node from its widgets and the kinds that feed it: a switch
becomes `switch/<kind>` of its branches, ResizeImageMaskNode the node of its mode.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from apps.graphs.descriptors import VALUE_KINDS
from apps.graphs.mathexpr import NAMES as MATH_NAMES
from apps.graphs.nodes_video import MAX_BATCHED
from apps.importer.comfy_rules import (
    CONTROL_VALUES,
    KindOf,
    ParamMap,
    Rule,
    area_warning,
    resample,
)

# TextGenerate's sampling_mode "on" widgets, in order (presence_penalty: newer saves only).
TEXTGEN_SAMPLING = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "seed",
                    "presence_penalty")
TEXTGEN_FLAGS = ("thinking", "use_default_template")  # booleans, in order; newer saves add each
# ComfyUI's speculative decoding (the newest saves' last widget): the farm has none, and without
# a checkpoint's multi-token-prediction weights it changes nothing in ComfyUI either
MTP_OPTIONS = ("auto", "off", "2", "3", "4", "5")
TEXTGEN_WIDGETS = ("prompt", "max_length", "sampling_mode",
                   *(f"sampling_mode.{name}" for name in TEXTGEN_SAMPLING), *TEXTGEN_FLAGS, "mtp")

WIDGETS: dict[str, tuple[str, ...]] = {
    "PrimitiveBoolean": ("value",),
    "StringConcatenate": ("string_a", "string_b", "delimiter"),
    "CameraAngle": ("horizontal_angle", "vertical_angle", "zoom", "view"),
    "ComfyMathExpression": ("expression",),
    "GetImageSize": (),
    "ResolutionSelector": ("aspect_ratio", "megapixels", "multiple", "minimum"),
    "ComfySwitchNode": ("switch",),
    "PreviewAny": (),
    "ImageCompare": (),
    "ImageScaleToTotalPixels": ("upscale_method", "megapixels", "resolution_steps"),
    "EmptyImage": ("width", "height", "batch_size", "color"),
    "BatchImagesNode": (),
    "ImageInvert": (),
    "ImageCompositeMasked": ("x", "y", "resize_source"),
    "ImageToMask": ("channel",),
    "MaskToImage": (),
    "ImagePadForOutpaint": ("left", "top", "right", "bottom", "feathering"),
    "SaveImageAdvanced": ("filename_prefix", "format"),  # the UI format: DYNAMIC_WIDGETS
    "ResizeAndPadImage": ("target_width", "target_height", "padding_color", "interpolation"),
    "UpscaleModelLoader": ("model_name",),
    "ImageUpscaleWithModel": (),
    "CreateVideo": ("fps",),
    "GetVideoComponents": (),
    "LoadVideo": ("file", "upload"),
    "SaveVideo": ("filename_prefix", "format", "codec"),
    "SaveAnimatedWEBP": ("filename_prefix", "fps", "lossless", "quality", "method"),
    # the UI format: DYNAMIC_WIDGETS; TEXTGEN_WIDGETS list its widgets in /object_info (the
    # dynamic combo's "on" widgets flat, by their API names)
    "TextGenerate": TEXTGEN_WIDGETS,
    "TextGenerateLTX2Prompt": TEXTGEN_WIDGETS,
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


def _textgen_widgets(values: list[Any]) -> dict[str, Any]:
    """TextGenerate (and TextGenerateLTX2Prompt): [prompt, max_length, sampling_mode, its "on"
    widgets…, thinking, use_default_template, mtp], read by kind after the mode so that every
    save ComfyUI writes reads right: numbers are the sampling widgets in order (6 before
    presence_penalty existed; none where ComfyUI saved "off", while the farm's /object_info
    lists them plain, so its editor keeps them for "off" too), a seed's control_after_generate
    word is skipped, booleans are the flags in order (older saves stop early), and one of
    ComfyUI's mtp options is mtp."""
    named = dict(zip(("prompt", "max_length", "sampling_mode"), values, strict=False))
    numbers, flags = iter(TEXTGEN_SAMPLING), iter(TEXTGEN_FLAGS)
    for value in values[3:]:
        name: str | None = None
        if isinstance(value, bool):
            name = next(flags, None)
        elif isinstance(value, int | float):
            number = next(numbers, None)
            name = f"sampling_mode.{number}" if number else None
        elif isinstance(value, str) and value in MTP_OPTIONS:
            name = "mtp"
        elif not (value is None or (isinstance(value, str) and value in CONTROL_VALUES)):
            name = "unread"  # a value no save of ComfyUI's has here: the warnings name it
        if name == "unread":  # as text: a list here would read as a link
            named.setdefault(name, str(value)[:80])
        elif name is not None:
            named.setdefault(name, value)
    return named


# Types whose widgets_values depend on a dynamic combo's option: read by these, not WIDGETS.
DYNAMIC_WIDGETS: dict[str, Callable[[list[Any]], dict[str, Any]]] = {
    "ResizeImageMaskNode": _resize_widgets,
    "SaveImageAdvanced": _save_advanced_widgets,
    "TextGenerate": _textgen_widgets,
    "TextGenerateLTX2Prompt": _textgen_widgets,
}


def _textgen_warnings(values: dict[str, Any]) -> list[str]:
    found = []
    mtp = values.get("mtp")
    if isinstance(mtp, str) and mtp.isdigit():
        found.append(f"mtp {mtp} is ignored: the farm generates one token at a time (the same "
                     "text ComfyUI gives without multi-token prediction)")
    if "unread" in values:
        found.append(f"the widget value {values['unread']!r} after the sampling mode is not one "
                     "TextGenerate saves: it is ignored")
    return found


def _ltx2_prompt_warnings(values: dict[str, Any]) -> list[str]:
    return [*_textgen_warnings(values),
            "TextGenerateLTX2Prompt's own LTX-2 system prompt (ComfyUI's text, in its "
            "comfy_extras/nodes_textgen.py) is not carried: the system turn is what its "
            "system_prompt input (or the node's `system` param) gives, empty otherwise"]


def _textgen_rule(*, ltx2: bool) -> Rule:
    """TextGenerate → text/generate; TextGenerateLTX2Prompt, the same with ComfyUI's LTX-2
    turns (`template: ltx2`). Video and audio inputs are not mapped."""
    return Rule(
        "text/generate",
        inputs={"clip": "encoder", "image": "image", "system_prompt": "system"},
        outputs=("text", "thinking"),
        params={"prompt": ParamMap("prompt"), "max_length": ParamMap("max_length"),
                "sampling_mode": ParamMap("sampling"),
                **{f"sampling_mode.{name}": ParamMap(name) for name in TEXTGEN_SAMPLING},
                "thinking": ParamMap("thinking", bool),
                "use_default_template": ParamMap("use_default_template", bool)},
        derive=(lambda values: {"template": "ltx2"}) if ltx2 else None,
        warnings=(_ltx2_prompt_warnings if ltx2 else _textgen_warnings,),
    )


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
    return _PREVIEW


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


def _video_format(values: dict[str, Any]) -> dict[str, Any]:
    """SaveVideo's container and codec: ComfyUI's auto / mp4 / h264 are our mp4 (H.264 + AAC);
    a webm container or a VP9 codec our webm (VP9 + Opus). ComfyUI has no crf widget here."""
    fmt, codec = str(values.get("format", "auto")).lower(), str(values.get("codec", "auto")).lower()
    return {"format": "webm" if fmt == "webm" or codec in ("vp9", "av1") else "mp4"}


def _video_format_warnings(values: dict[str, Any]) -> list[str]:
    fmt, codec = str(values.get("format", "auto")).lower(), str(values.get("codec", "auto")).lower()
    found = []
    if fmt not in ("auto", "mp4", "webm"):
        found.append(f"format {fmt!r} is kept as mp4 (the farm writes MP4 and WebM)")
    if codec == "av1":
        found.append("codec 'av1' is kept as VP9 in WebM (the farm encodes H.264 and VP9)")
    elif codec not in ("auto", "h264", "vp9"):
        found.append(f"codec {codec!r} is kept as H.264 (the farm encodes H.264 and VP9)")
    return found


def _webp_method_warnings(values: dict[str, Any]) -> list[str]:
    method = values.get("method", "default")
    if method not in (None, "default"):
        return [f"method {method!r} is kept as 'default' (the farm encodes WebP at method 4)"]
    return []


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


_SCALE = {"scale_method": ParamMap("method", resample)}
_RESIZE_IN = {"input": "image"}


def _area_scale(values: dict[str, Any]) -> list[str]:
    return area_warning({"upscale_method": values.get("scale_method")})


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
                    derive=_crop_or_stretch, warnings=(_area_scale,))
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
    if mode == "match size":
        return Rule("image/resize-to-match", inputs={**_RESIZE_IN, "resize_type.match": "match"},
                    outputs=("image",), params=_SCALE, derive=_crop_or_stretch,
                    warnings=(_area_scale,))
    if mode == "scale to multiple":
        return Rule("image/scale-to-multiple", inputs=_RESIZE_IN, outputs=("image",),
                    params={**_SCALE, "resize_type.multiple": ParamMap("multiple")},
                    warnings=(_area_scale,))
    return f"resize_type {mode!r} has no equivalent on this farm"


def _crop_or_stretch(values: dict[str, Any]) -> dict[str, Any]:
    """ResizeImageMaskNode's `crop` (default center) as our `fit`."""
    return {"fit": "stretch" if values.get("resize_type.crop") == "disabled" else "crop"}


_IMAGE_IN = {"image": "image"}


def _batch_refuse(values: dict[str, Any]) -> str | None:
    wired = [name for name in values if name.startswith("images.image")
             and values[name] is not None]
    past = [n for n in wired if not n.removeprefix("images.image").isdigit()
            or int(n.removeprefix("images.image")) >= MAX_BATCHED]
    if past:
        return (f"{', '.join(sorted(past))}: frames/batch takes at most {MAX_BATCHED} inputs "
                f"(images.image0 … images.image{MAX_BATCHED - 1})")
    return None


def _upscale_pick(values: dict[str, Any], kind_of: KindOf) -> Rule | str:
    """ImageUpscaleWithModel of a clip's frames (GetVideoComponents) → frames/upscale-with-model."""
    if kind_of("image") == "frames":
        return Rule("frames/upscale-with-model",
                    inputs={"upscale_model": "upscale_model", "image": "frames"},
                    outputs=("frames",))
    return VOCABULARY["ImageUpscaleWithModel"]
# Outputs that hand on an input unchanged while the node also does its own thing (PreviewAny
# shows its value in the editor and passes it on): their readers read that input instead.
ECHOES: dict[str, str] = {"PreviewAny": "source"}
# A choice ComfyUI makes lazily: a switch with a fixed value runs only its chosen branch.
SWITCH = "ComfySwitchNode"
_PREVIEW = Rule("util/preview", inputs={"source": "source"}, pick=_preview_pick)

VOCABULARY: dict[str, Rule] = {
    "PrimitiveBoolean": Rule("input/bool", outputs=("value",),
                             params={"value": ParamMap("value", bool)}),
    "StringConcatenate": Rule(
        "text/concat", outputs=("text",),
        params={name: ParamMap(name) for name in ("string_a", "string_b", "delimiter")},
    ),
    # Its camera_info (a 3D preview's camera) feeds no node here; `image` and `view` only
    # dress the editor's preview.
    "CameraAngle": Rule(
        "text/camera-angle", outputs=(None, "prompt"),
        params={name: ParamMap(name) for name in ("horizontal_angle", "vertical_angle", "zoom")},
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
    "PreviewAny": _PREVIEW,
    "TextGenerate": _textgen_rule(ltx2=False),  # the templates' LLM prompt enhancer
    "TextGenerateLTX2Prompt": _textgen_rule(ltx2=True),  # LTX-2's (its templates')
    "SaveImageAdvanced": Rule(
        "image/save", inputs={"images": "image"}, params={"filename_prefix": ParamMap("label")},
        derive=_save_format, warnings=(_save_format_warnings,),
    ),
    "ImageScaleBy": Rule(
        "image/scale-by", inputs=_IMAGE_IN, outputs=("image",),
        params={"upscale_method": ParamMap("method", resample), "scale_by": ParamMap("scale_by")},
        warnings=(area_warning,),
    ),
    "ImageScaleToTotalPixels": Rule(
        "image/scale-to-pixels", inputs=_IMAGE_IN, outputs=("image",),
        params={"upscale_method": ParamMap("method", resample),
                "megapixels": ParamMap("megapixels"),
                "resolution_steps": ParamMap("resolution_steps")},
        warnings=(area_warning,),
    ),
    "ResizeImageMaskNode": Rule(
        "image/resize", inputs=_RESIZE_IN, outputs=("image",), pick=_resize_pick,
    ),
    "ResizeAndPadImage": Rule(
        "image/resize", inputs=_IMAGE_IN, outputs=("image",),
        params={"target_width": ParamMap("width"), "target_height": ParamMap("height"),
                "padding_color": ParamMap("pad_color"),
                "interpolation": ParamMap("method", resample)},
        derive=lambda values: {"fit": "pad"},
        warnings=(lambda v: area_warning({"upscale_method": v.get("interpolation")}),),
    ),
    "EmptyImage": Rule(
        "image/empty", inputs={"width": "width", "height": "height"}, outputs=("image",),
        params={name: ParamMap(name) for name in ("width", "height", "color")},
        refuse=lambda values: (f"batch_size {values['batch_size']}: an image here is one image"
                               if values.get("batch_size", 1) != 1 else None),
    ),
    "BatchImagesNode": Rule(
        "frames/batch", inputs={f"images.image{i}": "frames" if i == 0 else f"frames{i + 1}"
                                for i in range(MAX_BATCHED)},
        outputs=("frames",), refuse=_batch_refuse,
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
    # ComfyUI tiles at 512 with 32 pixels of overlap: our node's defaults.
    "UpscaleModelLoader": Rule(
        "load/upscale-model", outputs=("upscale_model",),
        params={"model_name": ParamMap("file", folder="upscale_models")},
    ),
    "ImageUpscaleWithModel": Rule(
        "image/upscale-with-model", inputs={"upscale_model": "upscale_model", "image": "image"},
        outputs=("image",), pick=_upscale_pick,
    ),
    # Video (ComfyUI's comfy_extras/nodes_video.py): its IMAGE batch of a clip is our `frames`.
    "CreateVideo": Rule(
        "video/create", inputs={"images": "frames", "audio": "audio"},
        outputs=("video",), params={"fps": ParamMap("fps", float)},
    ),
    "GetVideoComponents": Rule(
        "video/components", inputs={"video": "video"}, outputs=("frames", "audio", "fps"),
    ),
    "LoadVideo": Rule("video/load", outputs=("video",), params={"file": ParamMap("asset")}),
    "SaveVideo": Rule(
        "video/save", inputs={"video": "video"}, params={"filename_prefix": ParamMap("label")},
        derive=_video_format, warnings=(_video_format_warnings,),
    ),
    "SaveAnimatedWEBP": Rule(
        "image/save-animated-webp", inputs={"images": "frames"},
        params={"filename_prefix": ParamMap("label"), "fps": ParamMap("fps", float),
                "lossless": ParamMap("lossless", bool), "quality": ParamMap("quality")},
        warnings=(_webp_method_warnings,),
    ),
}
