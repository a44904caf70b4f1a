"""What the importer knows about ComfyUI node types, as tables. TORCH-FREE.

Two tables carry the knowledge:
- `WIDGETS`: the positional order of each type's widgets, as the UI format saves them in
  `widgets_values` (ComfyUI's INPUT_TYPES order, minus the link inputs; `CONTROL` marks the
  extra `control_after_generate` value the UI saves after a seed widget).
- `RULES`: how a ComfyUI type becomes one of our node types: link inputs → our input ports,
  output slots → our output ports, widgets → our params (with a converter), and checks that
  report what our node cannot honour.
Types that are folded away (`FOLDED`, `CUT`), UI-only (`UI_ONLY`) or known to be unsupported
(`UNSUPPORTED`) are listed with the reason the report gives. The rules of ComfyUI's vocabulary
around the models (values, math, switch, previews, image ops) live in comfy_vocab.py and are
merged in here; a rule's shape is comfy_rules.py's.
"""

from __future__ import annotations

from typing import Any

from apps.graphs.nodes import MAX_SEED
from apps.importer import comfy_vocab
from apps.importer.comfy_rules import RESAMPLE, KindOf, ParamMap, Rule, Warn
from apps.importer.comfy_rules import area_warning as _area
from apps.importer.comfy_rules import resample as _resample
from apps.importer.comfy_vocab import DYNAMIC_WIDGETS

__all__ = ["DYNAMIC_WIDGETS", "RESAMPLE", "ParamMap", "Rule"]  # read from here by the importer

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
RULES.update(comfy_vocab.VOCABULARY)
WIDGETS.update(comfy_vocab.WIDGETS)

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


