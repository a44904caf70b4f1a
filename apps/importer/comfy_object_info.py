"""`/object_info`: the ComfyUI node types the farm runs, described as ComfyUI describes them.

Derived from the importer's tables (comfy_nodes.RULES, WIDGETS) and our descriptors; model
lists come from the fleet's catalog, LoadImage's list from the caller's uploads. Widgets the
farm accepts but ignores (a sampler name, a dtype) list the values ComfyUI offers, so a client
that validates against this answer still sends its workflow unchanged.
"""

from __future__ import annotations

from typing import Any

from apps.graphs.descriptors import Param, Port
from apps.graphs.mathexpr import NAMES as MATH_NAMES
from apps.graphs.nodes import SAMPLERS, SCHEDULERS
from apps.graphs.registry import descriptor_get
from apps.importer.comfy_families import CLIP_TYPES
from apps.importer.comfy_nodes import CONTROL, RESAMPLE, RULES, WIDGETS, Rule
from apps.importer.comfy_vocab import MTP_OPTIONS

KINDS = {"model": "MODEL", "text-encoder": "CLIP", "vae": "VAE", "conditioning": "CONDITIONING",
         "latent": "LATENT", "image": "IMAGE", "int": "INT", "float": "FLOAT", "text": "STRING",
         "noise": "NOISE", "sampler": "SAMPLER", "sigmas": "SIGMAS", "guider": "GUIDER",
         "bool": "BOOLEAN", "mask": "MASK", "upscale-model": "UPSCALE_MODEL",
         "latent-upscale-model": "LATENT_UPSCALE_MODEL",
         "frames": "IMAGE", "audio": "AUDIO", "video": "VIDEO"}

# Widgets whose ComfyUI spec is not our param's (converted values, or accepted and ignored).
SPECS: dict[str, list[Any]] = {
    "weight_dtype": [["default", "fp8_e4m3fn", "fp8_e4m3fn_fast", "fp8_e5m2"]],
    "type": [["stable_diffusion", *CLIP_TYPES]],  # the family check reads it (comfy_families)
    "device": [["default", "cpu"], {"advanced": True}],
    "batch_size": ["INT", {"default": 1, "min": 1, "max": 4096}],
    "cfg": ["FLOAT", {"default": 1.0, "min": 0.0, "max": 100.0, "step": 0.1, "round": 0.01}],
    "sampler_name": [list(SAMPLERS)],
    "scheduler": [list(SCHEDULERS)],
    "upscale_method": [list(RESAMPLE)],
    "crop": [["disabled", "center"]],
    "add_noise": [["enable", "disable"]],
    "return_with_leftover_noise": [["disable", "enable"]],
    "start_at_step": ["INT", {"default": 0, "min": 0, "max": 10000}],
    "end_at_step": ["INT", {"default": 10000, "min": 0, "max": 10000}],
    "filename_prefix": ["STRING", {"default": "ComfyUI"}],
    "text": ["STRING", {"multiline": True, "dynamicPrompts": True}],
    "format": [["png", "avif", "exr", "webp", "jpeg"]],  # SaveImageAdvanced: others → PNG
}
TYPE_SPECS: dict[tuple[str, str], list[Any]] = {  # a widget one type declares otherwise
    ("SamplerCustom", "add_noise"): ["BOOLEAN", {"default": True}],
    # video (comfy_vocab.py maps these onto mp4 / webm)
    ("SaveVideo", "format"): [["auto", "mp4", "webm"], {"default": "auto"}],
    ("SaveVideo", "codec"): [["auto", "h264", "vp9"], {"default": "auto"}],
    ("SaveAnimatedWEBP", "method"): [["default", "fastest", "slowest"]],
    # LTX-2 (comfy_ltx2.py): accepted as ComfyUI declares them
    ("LTXVImgToVideoInplace", "strength"): ["FLOAT", {"default": 1.0, "min": 0.0, "max": 1.0}],
    ("LTXVImgToVideoInplace", "bypass"): ["BOOLEAN", {"default": False}],
    ("LTXVAddGuide", "frame_idx"): ["INT", {"default": 0, "min": -9999, "max": 9999}],
    ("LTXVAddGuide", "strength"): ["FLOAT", {"default": 1.0, "min": 0.0, "max": 10.0,
                                             "step": 0.01}],
    ("EmptyLTXVLatentVideo", "length"): ["INT", {"default": 97, "min": 1, "max": 16384,
                                                 "step": 8}],
    # TextGenerate's speculative decoding: accepted as ComfyUI declares it, and ignored
    **{(name, "mtp"): [list(MTP_OPTIONS), {"default": "auto"}]
       for name in ("TextGenerate", "TextGenerateLTX2Prompt")},
}
# Inputs ComfyUI declares optional, and those of any type ("*": a switch's branches, what a
# PreviewAny shows); the math node's inputs are listed once, by their API names.
OPTIONAL: dict[str, frozenset[str]] = {
    "ComfySwitchNode": frozenset({"on_false", "on_true"}),
    "ImageCompositeMasked": frozenset({"mask"}),
    "CreateVideo": frozenset({"audio"}),
    "TextGenerate": frozenset({"image", "system_prompt"}),
    "TextGenerateLTX2Prompt": frozenset({"image", "system_prompt"}),
    "ComfyMathExpression": frozenset(f"values.{n}" for n in MATH_NAMES),
}
ANY_TYPE: dict[str, frozenset[str]] = {
    "ComfySwitchNode": frozenset({"on_false", "on_true"}),
    "PreviewAny": frozenset({"source"}),
}
ALIASES = frozenset(MATH_NAMES)  # ComfyMathExpression's inputs without the `values.` prefix
SEEDS = {"seed", "noise_seed"}
VIDEO_SUFFIXES = (".mp4", ".webm", ".mov", ".mkv")  # upload names LoadVideo lists, LoadImage not
DISPLAY = {"CLIPTextEncode": "CLIP Text Encode (Prompt)", "KSampler": "KSampler",
           "CheckpointLoaderSimple": "Load Checkpoint",
           "UNETLoader": "Load Diffusion Model", "CLIPLoader": "Load CLIP",
           "VAELoader": "Load VAE", "LoadImage": "Load Image", "SaveImage": "Save Image",
           "PreviewImage": "Preview Image", "ImageScale": "Upscale Image"}
_SHIFT = ["FLOAT", {"default": 3.0, "min": 0.0, "max": 100.0, "step": 0.01}]
_LTX_SHIFTS = {"max_shift": ["FLOAT", {"default": 2.05, "min": 0.0, "max": 100.0, "step": 0.01}],
               "base_shift": ["FLOAT", {"default": 0.95, "min": 0.0, "max": 100.0, "step": 0.01}]}
_LTX_FRAMES = {"min": 1, "max": 1000, "step": 1}
_PROMPTS = {"positive": ["CONDITIONING"], "negative": ["CONDITIONING"]}
EXTRA_TYPES: dict[str, dict[str, Any]] = {  # folded / cut on the farm, still accepted
    "ModelSamplingAuraFlow": {"required": {"model": ["MODEL"], "shift": _SHIFT},
                              "output": ["MODEL"], "category": "advanced/model"},
    "ModelSamplingSD3": {"required": {"model": ["MODEL"], "shift": _SHIFT},
                         "output": ["MODEL"], "category": "advanced/model"},
    "ModelSamplingFlux": {"required": {
        "model": ["MODEL"],
        "max_shift": ["FLOAT", {"default": 1.15, "min": 0.0, "max": 100.0, "step": 0.01}],
        "base_shift": ["FLOAT", {"default": 0.5, "min": 0.0, "max": 100.0, "step": 0.01}],
        "width": ["INT", {"default": 1024, "min": 16, "max": 16384, "step": 8}],
        "height": ["INT", {"default": 1024, "min": 16, "max": 16384, "step": 8}]},
        "output": ["MODEL"], "category": "advanced/model"},
    "FluxGuidance": {"required": {
        "conditioning": ["CONDITIONING"],
        "guidance": ["FLOAT", {"default": 3.5, "min": 0.0, "max": 100.0, "step": 0.1}]},
        "output": ["CONDITIONING"], "category": "advanced/conditioning/flux"},
    "ConditioningZeroOut": {"required": {"conditioning": ["CONDITIONING"]},
                            "output": ["CONDITIONING"], "category": "advanced/conditioning"},
    # LTX-2's nodes the importer folds into the ltx2/* nodes (apps/importer/comfy_ltx2.py)
    "LTXVConditioning": {"required": {**_PROMPTS, "frame_rate": [
        "FLOAT", {"default": 25.0, "min": 0.0, "max": 1000.0, "step": 0.01}]},
        "output": ["CONDITIONING", "CONDITIONING"], "category": "conditioning/video_models"},
    "LTXVEmptyLatentAudio": {"required": {
        "frames_number": ["INT", {"default": 97, **_LTX_FRAMES}],
        "frame_rate": ["INT", {"default": 25, **_LTX_FRAMES}],
        "batch_size": ["INT", {"default": 1, "min": 1, "max": 4096}], "audio_vae": ["VAE"]},
        "output": ["LATENT"], "category": "model/latent/ltxv"},
    "LTXVConcatAVLatent": {"required": {"video_latent": ["LATENT"], "audio_latent": ["LATENT"]},
                           "output": ["LATENT"], "category": "latent/video/ltxv"},
    "LTXVSeparateAVLatent": {"required": {"av_latent": ["LATENT"]},
                             "output": ["LATENT", "LATENT"], "category": "latent/video/ltxv"},
    "LTXVCropGuides": {"required": {**_PROMPTS, "latent": ["LATENT"]},
                       "output": ["CONDITIONING", "CONDITIONING", "LATENT"],
                       "category": "conditioning/video_models"},
    "ModelSamplingLTXV": {"required": {"model": ["MODEL"], **_LTX_SHIFTS},
                          "output": ["MODEL"], "category": "advanced/model"},
    "LTXVScheduler": {"required": {
        "steps": ["INT", {"default": 20, "min": 1, "max": 10000}], **_LTX_SHIFTS,
        "stretch": ["BOOLEAN", {"default": True}],
        "terminal": ["FLOAT", {"default": 0.1, "min": 0.0, "max": 0.99, "step": 0.01}]},
        "output": ["SIGMAS"], "category": "sampling/custom_sampling/schedulers"},
    "LTXVPreprocess": {"required": {"image": ["IMAGE"], "img_compression": [
        "INT", {"default": 35, "min": 0, "max": 100}]},
        "output": ["IMAGE"], "category": "video/preprocessors"},
    "LTXVAudioVAEDecode": {"required": {"samples": ["LATENT"], "audio_vae": ["VAE"]},
                           "output": ["AUDIO"], "category": "model/latent/ltxv"},
    "VAEDecodeAudio": {"required": {"samples": ["LATENT"], "vae": ["VAE"]},
                       "output": ["AUDIO"], "category": "latent/audio"},
}


def object_info(*, catalog: dict[str, list[str]], uploads: list[str]) -> dict[str, Any]:
    """Every ComfyUI type the farm accepts → ComfyUI's node_info shape."""
    info = {name: _mapped(name, rule, catalog, uploads) for name, rule in RULES.items()}
    for name, spec in EXTRA_TYPES.items():
        info[name] = _info(name, {"required": spec["required"]}, spec["output"],
                           spec["output"], spec["category"], output_node=False)
    return info


def _mapped(name: str, rule: Rule, catalog: dict[str, list[str]],
            uploads: list[str]) -> dict[str, Any]:
    descriptor = descriptor_get(rule.type)
    assert descriptor is not None  # tests/apps/importer/test_mapping.py: every rule has one
    required: dict[str, list[Any]] = {}
    optional: dict[str, list[Any]] = {}
    for comfy, port in rule.inputs.items():
        if name == "ComfyMathExpression" and comfy in ALIASES:
            continue
        spec = ["*"] if comfy in ANY_TYPE.get(name, ()) else [_kind(descriptor.input(port))]
        (optional if comfy in OPTIONAL.get(name, ()) else required)[comfy] = spec
    for widget in WIDGETS.get(name, ()):
        if widget in (CONTROL, "upload") or widget in required:
            continue
        mapping = rule.params.get(widget)
        param = descriptor.param(mapping.name) if mapping is not None else None
        required[widget] = TYPE_SPECS.get((name, widget)) or _widget(widget, param, catalog,
                                                                      uploads)
    outputs = [_kind(descriptor.output(p)) if p else "MASK" for p in rule.outputs]
    if name == "ComfySwitchNode":
        outputs = ["*"]
    inputs = {"required": required, **({"optional": optional} if optional else {})}
    return _info(name, inputs, outputs, outputs, descriptor.category,
                 output_node=descriptor.produces_takes or descriptor.shows_value)


def _kind(port: Port | None) -> str:
    return KINDS.get(port.kind, "*") if port is not None else "*"


def _widget(widget: str, param: Param | None, catalog: dict[str, list[str]],
            uploads: list[str]) -> list[Any]:
    if widget in SPECS:
        return SPECS[widget]
    if param is None:
        return ["*"]
    if param.type == "model":
        return [catalog.get(param.options_from or "", []), {}]
    if param.type == "asset" and param.media == "video":  # LoadVideo lists clips only
        return [[u for u in uploads if u.lower().endswith(VIDEO_SUFFIXES)], {"video_upload": True}]
    if param.type == "asset":
        return [[u for u in uploads if not u.lower().endswith(VIDEO_SUFFIXES)],
                {"image_upload": True}]
    if param.type == "enum":
        return [list(param.choices or ()), {"default": param.default}]
    if param.type in ("int", "float"):
        opts: dict[str, Any] = {"default": param.default if param.default is not None else 0}
        if param.min is not None:
            opts["min"] = param.min
        if param.max is not None:
            opts["max"] = param.max
        if widget in SEEDS:
            opts["control_after_generate"] = True
        return ["INT" if param.type == "int" else "FLOAT", opts]
    if param.type == "bool":
        return ["BOOLEAN", {"default": bool(param.default)}]
    return ["STRING", {"default": param.default or ""}]


def _info(name: str, inputs: dict[str, Any], output: list[str], names: list[str],
          category: str, *, output_node: bool) -> dict[str, Any]:
    return {
        "input": inputs,
        "input_order": {k: list(v) for k, v in inputs.items()},
        "output": output, "output_is_list": [False] * len(output), "output_name": names,
        "name": name, "display_name": DISPLAY.get(name, name), "description": "",
        "python_module": "nodes", "category": category, "output_node": output_node,
    }
