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

import math
from collections.abc import Callable
from typing import Any

from apps.graphs.nodes import MAX_SEED, MAX_STEPS, SAMPLERS, SCHEDULERS
from apps.graphs.nodes_qwen import QWEN21_IMAGES, REFERENCE_METHODS
from apps.importer import comfy_ltx2, comfy_minimaxh3, comfy_vocab
from apps.importer.comfy_families import SAMPLER_PARAM_NODES
from apps.importer.comfy_rules import CONTROL, CONTROL_VALUES, RESAMPLE, KindOf, ParamMap, Rule, Warn
from apps.importer.comfy_rules import area_warning as _area
from apps.importer.comfy_rules import resample as _resample
from apps.importer.comfy_vocab import DYNAMIC_WIDGETS

# read from here by the importer
__all__ = ["CONTROL", "CONTROL_VALUES", "DYNAMIC_WIDGETS", "RESAMPLE", "ParamMap", "Rule"]

WIDGETS: dict[str, tuple[str, ...]] = {
    "CheckpointLoaderSimple": ("ckpt_name",),
    "UNETLoader": ("unet_name", "weight_dtype"),
    "CLIPLoader": ("clip_name", "type", "device"),
    "DualCLIPLoader": ("clip_name1", "clip_name2", "type", "device"),
    "VAELoader": ("vae_name",),
    "LoraLoaderModelOnly": ("lora_name", "strength_model"),
    "LoraLoader": ("lora_name", "strength_model", "strength_clip"),
    "CLIPTextEncode": ("text",),
    "ConditioningZeroOut": (),
    "EmptyLatentImage": ("width", "height", "batch_size"),
    "EmptySD3LatentImage": ("width", "height", "batch_size"),
    "EmptyFlux2LatentImage": ("width", "height", "batch_size"),
    "Flux2Scheduler": ("steps", "width", "height"),
    "ReferenceLatent": (),
    "FluxKontextMultiReferenceLatentMethod": ("reference_latents_method",),
    "TextEncodeQwenImageEdit": ("prompt",),
    "TextEncodeQwenImageEditPlus": ("prompt",),
    "TextEncodeQwenImage21": ("prompt", "negative_prompt", "resolution"),
    "FluxKontextImageScale": (),
    "CFGNorm": ("strength",),
    "KSampler": ("seed", CONTROL, "steps", "cfg", "sampler_name", "scheduler", "denoise"),
    "KSamplerAdvanced": (
        "add_noise", "noise_seed", CONTROL, "steps", "cfg", "sampler_name", "scheduler",
        "start_at_step", "end_at_step", "return_with_leftover_noise",
    ),
    "EmptyHunyuanLatentVideo": ("width", "height", "length", "batch_size"),
    "WanImageToVideo": ("width", "height", "length", "batch_size"),
    "InpaintModelConditioning": ("noise_mask",),
    "DifferentialDiffusion": ("strength",),
    "WanFirstLastFrameToVideo": ("width", "height", "length", "batch_size"),
    "Wan22ImageToVideoLatent": ("width", "height", "length", "batch_size"),
    "ImageFromBatch": ("batch_index", "length"),
    "ModelSamplingAuraFlow": ("shift",),
    "ModelSamplingSD3": ("shift",),
    "ModelSamplingFlux": ("max_shift", "base_shift", "width", "height"),
    "FluxGuidance": ("guidance",),
    "RandomNoise": ("noise_seed", CONTROL),
    "KSamplerSelect": ("sampler_name",),
    "BasicScheduler": ("scheduler", "steps", "denoise"),
    "ManualSigmas": ("sigmas",),
    "SDTurboScheduler": ("steps", "denoise"),
    "BasicGuider": (),
    "CFGGuider": ("cfg",),
    "SamplerCustomAdvanced": (),
    "SamplerCustom": ("add_noise", "noise_seed", CONTROL, "cfg"),
    "VAEDecode": (),
    "VAEEncode": (),
    "VAEDecodeTiled": ("tile_size", "overlap", "temporal_size", "temporal_overlap"),
    "VAEEncodeTiled": ("tile_size", "overlap", "temporal_size", "temporal_overlap"),
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

# The generic samplers and schedulers (apps/graphs/nodes.py); any other name keeps the family's own.
OUR_SAMPLERS = frozenset(SAMPLERS)
OUR_SCHEDULERS = frozenset(SCHEDULERS)

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
        found.append(f"sampler {sampler!r} is not on this farm: it samples with the model "
                     "family's own sampler")
    if isinstance(scheduler, str) and scheduler not in OUR_SCHEDULERS:
        found.append(f"scheduler {scheduler!r} is not on this farm: it uses the model family's "
                     "own schedule")
    cfg = values.get("cfg")
    if isinstance(cfg, int | float) and cfg < 1:
        found.append(f"cfg {cfg} is below 1: guidance 0 (no CFG) is used")
    return found


def tail_denoise(total: int, run: int) -> float:
    """The `denoise` for which our sampler runs exactly the last `run` steps of a `total`-step
    schedule. The flow families skip int(total − total·denoise) steps (diffusers' img2img
    rounding), so run/total is nudged down by an ulp where float rounding would skip one step
    too few (25 steps from step 11: 14/25 skips 10)."""
    denoise = run / total
    for _ in range(4):
        if int(max(total - min(total * denoise, total), 0)) == total - run:
            break
        denoise = math.nextafter(denoise, 0.0)
    return denoise


def _clip_family(clip_type: Any) -> str:
    """A text-encoder loader's `type` → our loader's `family`: the registered family ComfyUI
    builds that encoder for, else "auto" (the first family that recognises the file)."""
    from apps.importer.comfy_families import CLIP_TYPES
    from workers.models.families import REGISTERED

    family = CLIP_TYPES.get(str(clip_type), "")
    return family if family in REGISTERED else "auto"


def _ksampler_denoise(values: dict[str, Any]) -> dict[str, Any]:
    """ComfyUI's KSampler `denoise` d < 1 runs `steps` steps: the last ones of a schedule of
    int(steps / d) steps (comfy/samplers.py KSampler.set_steps). Ours runs the tail of its own
    `steps`: the same sigmas once steps is the longer schedule and denoise its tail."""
    steps, denoise = values.get("steps"), values.get("denoise")
    if not isinstance(steps, int) or not isinstance(denoise, int | float) or steps < 1:
        return {}
    if not 0 < denoise <= 0.9999 or int(steps / denoise) > MAX_STEPS:
        return {}
    total = int(steps / denoise)
    return {"steps": total, "denoise": tail_denoise(total, steps)}


def _ksampler_denoise_range(values: dict[str, Any]) -> list[str]:
    steps, denoise = values.get("steps"), values.get("denoise")
    if (isinstance(steps, int) and isinstance(denoise, int | float) and 0 < denoise <= 0.9999
            and steps >= 1 and int(steps / denoise) > MAX_STEPS):
        return [f"denoise {denoise:g} of {steps} steps is a schedule of {int(steps / denoise)} "
                f"steps in ComfyUI, more than the farm's {MAX_STEPS}: the last {denoise:g} of "
                f"{steps} steps is sampled instead"]
    return []


def _advanced_sampler_names(values: dict[str, Any]) -> list[str]:
    """KSamplerAdvanced keeps the family's own sampler and schedule: name what it ignores."""
    found = [f"{widget} {values[widget]!r} is ignored: KSamplerAdvanced samples with the model "
             "family's own sampler and schedule" for widget in ("sampler_name", "scheduler")
             if isinstance(values.get(widget), str)]
    cfg = values.get("cfg")
    if isinstance(cfg, int | float) and cfg < 1:
        found.append(f"cfg {cfg} is below 1: guidance 0 (no CFG) is used")
    return found


def _ours(names: frozenset[str]) -> Callable[[Any], Any]:
    """A ComfyUI sampler / scheduler name → ours; a name the farm lacks → "default" (warned)."""
    return lambda name: name if name in names else "default"


def _unknown(widget: str, names: frozenset[str]) -> Callable[[dict[str, Any]], str | None]:
    def check(values: dict[str, Any]) -> str | None:
        value = values.get(widget)
        if isinstance(value, str) and value not in names:
            return f"{widget} {value!r} is not on this farm (it has {', '.join(sorted(names))})"
        return None

    return check


def _enabled(value: Any) -> bool:
    """KSamplerAdvanced's "enable" / "disable" switches."""
    return value in ("enable", True)


def _image_from_batch_pick(values: dict[str, Any], kind_of: KindOf) -> Rule | str:
    """ImageFromBatch of one frame of a clip (VAEDecode of a video latent) → frames/image."""
    if kind_of("image") != "frames":
        return "ImageFromBatch picks frames of a decoded clip only on this farm"
    if values.get("length", 1) != 1:
        return "ImageFromBatch of more than one frame: the farm picks one frame (length 1)"
    return Rule("frames/image", inputs={"image": "frames"}, outputs=("image",),
                params={"batch_index": ParamMap("index")})


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


def _qwen21_refuse(values: dict[str, Any]) -> str | None:
    """What qwenimage21/encode cannot take: images past ComfyUI's image_16."""
    extra = sorted(name for name in values if name.startswith("images.image_")
                   and name.removeprefix("images.image_") not in QWEN21_NUMBERS
                   and values[name] is not None)
    if extra:
        return (f"{', '.join(extra)}: the farm's Qwen-Image 2.1 prompt takes at most "
                f"{QWEN21_IMAGES} images (images.image_1 … images.image_{QWEN21_IMAGES})")
    return None


def qwen_reference_latent(family: str | None, title: str) -> Rule | str:
    """ReferenceLatent by the family of its prompt: FLUX.2's node (also when no family is
    known), Qwen-Image-Edit's, FLUX.1 Kontext's, else why it cannot map."""
    if family in (None, "flux2"):
        return RULES["ReferenceLatent"]
    if family == "qwenimage":
        return QWEN_REFERENCE_LATENT
    if family == "flux1":
        return FLUX1_REFERENCE_LATENT
    if family == "qwenimage21":
        return ("ReferenceLatent on a Qwen-Image 2.1 prompt is not supported: 2.1 reads its "
                "references through TextEncodeQwenImage21's images (each an image slot in the "
                "prompt), wire the images there")
    return (f"ReferenceLatent on a {title} prompt is not supported: only FLUX.2, FLUX.1 "
            "Kontext and Qwen-Image(-Edit) prompts take reference latents on this farm")


def qwen_reference_method(family: str | None, title: str, method: Any) -> Rule | str:
    """FluxKontextMultiReferenceLatentMethod by the family of its prompt: on Qwen-Image's, how
    its transformer reads the references (`qwenimage/reference-latent`'s `method`: index, or
    index_timestep_zero: Qwen-Image-Edit-2511's); else why it cannot map."""
    named = f"FluxKontextMultiReferenceLatentMethod {method!r}"
    if family != "qwenimage":
        on = f" on a {title} prompt" if family is not None else ""
        return (f"{named}{on} is not supported: only Qwen-Image(-Edit) prompts take a reference "
                "latents method on this farm")
    if method not in QWEN_REFERENCE_METHODS:
        return (f"{named} is not supported on Qwen-Image: its transformer places each reference "
                "latent at its own index (diffusers' image shapes), read at the image's "
                "timestep ('index') or at timestep 0 ('index_timestep_zero', 2511); 'offset' "
                "and 'uxo/uno' (references side by side in one index) are not")
    return RULES["FluxKontextMultiReferenceLatentMethod"]


# --- the mapping ------------------------------------------------------------------------------

_SEED_AND_STEPS = {"steps": ParamMap("steps"), "cfg": ParamMap("guidance", cfg_to_guidance)}
_SAMPLER_NAMES = {"sampler_name": ParamMap("sampler", _ours(OUR_SAMPLERS)),
                  "scheduler": ParamMap("scheduler", _ours(OUR_SCHEDULERS))}
_SAMPLER_INPUTS = {"model": "model", "positive": "positive", "negative": "negative",
                   "latent_image": "latent"}
_POLICY = "the farm's device policy chooses devices and dtypes"
_LORA_PARAMS = {"lora_name": ParamMap("lora", folder="loras"),
                "strength_model": ParamMap("strength")}


RULES: dict[str, Rule] = {
    "CheckpointLoaderSimple": Rule(  # an all-in-one file (SDXL's): MODEL, CLIP, VAE
        "load/checkpoint", outputs=("model", "encoder", "vae"),
        params={"ckpt_name": ParamMap("file", folder="checkpoints")},
    ),
    "UNETLoader": Rule(
        "load/diffusion-model", outputs=("model",),
        params={"unet_name": ParamMap("file", folder="diffusion_models")},
        warnings=(_differs("weight_dtype", "default", _POLICY),),
    ),
    "CLIPLoader": Rule(  # `type`: the family whose encoder it is (a Qwen3: Z-Image or Klein)
        "load/text-encoder", outputs=("encoder",),
        params={"clip_name": ParamMap("file", folder="text_encoders"),
                "type": ParamMap("family", _clip_family)},
        warnings=(_differs("device", "default", _POLICY),),  # `type` as evidence: comfy_families
    ),
    "DualCLIPLoader": Rule(  # FLUX.1's CLIP-L + T5: the family recognises each from its keys
        "load/text-encoder", outputs=("encoder",),
        params={"clip_name1": ParamMap("file", folder="text_encoders"),
                "clip_name2": ParamMap("file_2", folder="text_encoders"),
                "type": ParamMap("family", _clip_family)},
        warnings=(_differs("device", "default", _POLICY),),  # `type` as evidence: comfy_families
    ),
    "LoraLoaderModelOnly": Rule(
        "load/lora", inputs={"model": "model"}, outputs=("model",), params=_LORA_PARAMS,
    ),
    "LoraLoader": Rule(  # MODEL and CLIP: the text encoder's half at strength_clip
        "load/lora", inputs={"model": "model", "clip": "encoder"}, outputs=("model", "encoder"),
        params={**_LORA_PARAMS, "strength_clip": ParamMap("strength_clip")},
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
    "EmptyFlux2LatentImage": Rule(  # 128 channels at ÷16: the sampler's family makes them
        "latent/empty", outputs=("latent",),
        params={"width": ParamMap("width"), "height": ParamMap("height")},
        warnings=(_differs("batch_size", 1, "the farm renders one image per run"),),
    ),
    "ReferenceLatent": Rule(  # FLUX.2's (Klein / dev editing): the latent is a reference
        "flux2/reference-latent", inputs={"conditioning": "conditioning", "latent": "latent"},
        outputs=("conditioning",),
    ),
    "FluxKontextMultiReferenceLatentMethod": Rule(  # on a Qwen-Image prompt (api_format picks)
        "qwenimage/reference-latent", inputs={"conditioning": "conditioning"},
        outputs=("conditioning",), params={"reference_latents_method": ParamMap("method")},
    ),
    "TextEncodeQwenImageEdit": Rule(  # Qwen-Image-Edit: one image, shown to the VL at ~1 MP
        "qwenimage/edit", inputs={"clip": "encoder", "vae": "vae", "image": "image"},
        outputs=("conditioning",), params={"prompt": ParamMap("text")},
        derive=lambda _: {"variant": "edit"},
    ),
    "TextEncodeQwenImageEditPlus": Rule(  # 2509 / 2511: up to three images, ~384² for the VL
        "qwenimage/edit",
        inputs={"clip": "encoder", "vae": "vae", "image1": "image", "image2": "image_2",
                "image3": "image_3"},
        outputs=("conditioning",), params={"prompt": ParamMap("text")},
        derive=lambda _: {"variant": "plus"},
    ),
    "TextEncodeQwenImage21": Rule(  # 2.1: prompt, negative and latent, images_N (autogrow)
        "qwenimage21/encode",
        inputs={"clip": "encoder", "vae": "vae",
                **{f"images.image_{i}": f"image_{i}" for i in range(1, QWEN21_IMAGES + 1)}},
        outputs=("positive", "negative", "latent"),
        params={"prompt": ParamMap("text"), "negative_prompt": ParamMap("negative_text"),
                "resolution": ParamMap("resolution")},
        refuse=_qwen21_refuse,
    ),
    "FluxKontextImageScale": Rule(  # edit templates size the latent from the reference
        "image/scale-to-kontext", inputs={"image": "image"}, outputs=("image",),
        derive=lambda _: {"method": "lanczos", "fit": "crop"},
    ),
    "Flux2Scheduler": Rule(  # its width / height may be wired (GetImageSize in edit templates)
        "flux2/scheduler", outputs=("sigmas",),
        params={"steps": ParamMap("steps"), "width": ParamMap("width"),
                "height": ParamMap("height")},
    ),
    "KSampler": Rule(
        "sample", inputs=_SAMPLER_INPUTS, outputs=("latent",),
        params={"seed": ParamMap("seed", _seed), **_SEED_AND_STEPS, **_SAMPLER_NAMES,
                "denoise": ParamMap("denoise")},
        warnings=(_sampler_names, _seed_range, _ksampler_denoise_range),
        derive=_ksampler_denoise,
    ),
    "KSamplerAdvanced": Rule(  # its step window: two chain (Wan 2.2's experts)
        "sample/advanced", inputs=_SAMPLER_INPUTS, outputs=("latent",),
        params={"noise_seed": ParamMap("seed", _seed), **_SEED_AND_STEPS,
                "start_at_step": ParamMap("start_step"), "end_at_step": ParamMap("end_step"),
                "add_noise": ParamMap("add_noise", _enabled),
                "return_with_leftover_noise": ParamMap("return_with_leftover_noise", _enabled)},
        warnings=(_advanced_sampler_names, _seed_range),
    ),
    # Wan (video): ComfyUI's Wan templates make their latent with EmptyHunyuanLatentVideo
    "EmptyHunyuanLatentVideo": Rule(
        "latent/empty-video", outputs=("latent",),
        params={"width": ParamMap("width"), "height": ParamMap("height"),
                "length": ParamMap("length"), "batch_size": ParamMap("batch")},
    ),
    "InpaintModelConditioning": Rule(  # FLUX.1 Fill's (the runner refuses other prompts)
        "flux1/inpaint",
        inputs={"positive": "positive", "negative": "negative", "vae": "vae", "pixels": "image",
                "mask": "mask"},
        outputs=("positive", "negative", "latent"),
        params={"noise_mask": ParamMap("noise_mask")},
    ),
    "DifferentialDiffusion": Rule(
        "model/differential-diffusion", inputs={"model": "model"}, outputs=("model",),
        params={"strength": ParamMap("strength")},
    ),
    "WanImageToVideo": Rule(  # clip_vision_output (Wan 2.1's CLIP image embeds) is not read
        "wan/image-to-video",
        inputs={"positive": "positive", "negative": "negative", "vae": "vae",
                "start_image": "start_image"},
        outputs=("positive", "negative", "latent"),
        params={"width": ParamMap("width"), "height": ParamMap("height"),
                "length": ParamMap("length"), "batch_size": ParamMap("batch")},
    ),
    "WanFirstLastFrameToVideo": Rule(
        "wan/image-to-video",
        inputs={"positive": "positive", "negative": "negative", "vae": "vae",
                "start_image": "start_image", "end_image": "end_image"},
        outputs=("positive", "negative", "latent"),
        params={"width": ParamMap("width"), "height": ParamMap("height"),
                "length": ParamMap("length"), "batch_size": ParamMap("batch")},
    ),
    "Wan22ImageToVideoLatent": Rule(  # TI2V-5B: text to video, or image to video with a start
        "wan/ti2v-latent",
        inputs={"vae": "vae", "start_image": "start_image"}, outputs=("latent",),
        params={"width": ParamMap("width"), "height": ParamMap("height"),
                "length": ParamMap("length"), "batch_size": ParamMap("batch")},
    ),
    "ImageFromBatch": Rule("frames/image", pick=_image_from_batch_pick),
    "RandomNoise": Rule(
        "sampling/noise", outputs=("noise",), params={"noise_seed": ParamMap("noise_seed", _seed)},
        warnings=(_seed_range,),
    ),
    "KSamplerSelect": Rule(
        "sampling/sampler", outputs=("sampler",), params={"sampler_name": ParamMap("sampler_name")},
        refuse=_unknown("sampler_name", OUR_SAMPLERS),
    ),
    "BasicScheduler": Rule(
        "sampling/scheduler", inputs={"model": "model"}, outputs=("sigmas",),
        params={"scheduler": ParamMap("scheduler"), "steps": ParamMap("steps"),
                "denoise": ParamMap("denoise")},
        refuse=_unknown("scheduler", OUR_SCHEDULERS),
    ),
    "SDTurboScheduler": Rule(
        "sampling/sd-turbo-scheduler", inputs={"model": "model"}, outputs=("sigmas",),
        params={"steps": ParamMap("steps"), "denoise": ParamMap("denoise")},
    ),
    "ManualSigmas": Rule(
        "sampling/manual-sigmas", outputs=("sigmas",), params={"sigmas": ParamMap("sigmas")},
    ),
    "BasicGuider": Rule(
        "sampling/guider", inputs={"model": "model", "conditioning": "conditioning"},
        outputs=("guider",),
    ),
    "CFGGuider": Rule(
        "sampling/cfg-guider",
        inputs={"model": "model", "positive": "positive", "negative": "negative"},
        outputs=("guider",), params={"cfg": ParamMap("cfg")},
    ),
    "SamplerCustomAdvanced": Rule(
        "sampling/custom-advanced",
        inputs={"noise": "noise", "guider": "guider", "sampler": "sampler", "sigmas": "sigmas",
                "latent_image": "latent"},
        outputs=("latent", "denoised"),
    ),
    "SamplerCustom": Rule(
        "sampling/custom",
        inputs={"model": "model", "positive": "positive", "negative": "negative",
                "sampler": "sampler", "sigmas": "sigmas", "latent_image": "latent"},
        outputs=("latent", "denoised"),
        params={"add_noise": ParamMap("add_noise", bool), "noise_seed": ParamMap("noise_seed", _seed),
                "cfg": ParamMap("cfg")},
        warnings=(_seed_range,),
    ),
    "VAEDecode": Rule("vae/decode", inputs={"samples": "latent", "vae": "vae"}, outputs=("image",)),
    "VAEEncode": Rule("vae/encode", inputs={"pixels": "image", "vae": "vae"}, outputs=("latent",)),
    # temporal_size / temporal_overlap tile video VAEs in time: an image VAE has no time axis
    # (ComfyUI ignores them there too).
    "VAEDecodeTiled": Rule(
        "vae/decode-tiled", inputs={"samples": "latent", "vae": "vae"}, outputs=("image",),
        params={"tile_size": ParamMap("tile_size"), "overlap": ParamMap("overlap")},
    ),
    "VAEEncodeTiled": Rule(
        "vae/encode-tiled", inputs={"pixels": "image", "vae": "vae"}, outputs=("latent",),
        params={"tile_size": ParamMap("tile_size"), "overlap": ParamMap("overlap")},
    ),
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
QWEN21_NUMBERS = frozenset(str(i) for i in range(1, QWEN21_IMAGES + 1))
QWEN_REFERENCE_METHODS = frozenset(REFERENCE_METHODS) - {"auto"}  # ComfyUI's names, as ours
# ReferenceLatent on a Qwen-Image prompt (api_format picks it by the prompt's family)
QWEN_REFERENCE_LATENT = Rule(
    "qwenimage/reference-latent", inputs={"conditioning": "conditioning", "latent": "latent"},
    outputs=("conditioning",),
)
# ReferenceLatent on a FLUX.1 prompt: FLUX.1 Kontext's reference (api_format picks it alike)
FLUX1_REFERENCE_LATENT = Rule(
    "flux1/reference-latent", inputs={"conditioning": "conditioning", "latent": "latent"},
    outputs=("conditioning",),
)
RULES.update(comfy_vocab.VOCABULARY)
WIDGETS.update(comfy_vocab.WIDGETS)
RULES.update(comfy_ltx2.RULES)  # LTX-2: most of its nodes are settled per workflow (rewrite)
WIDGETS.update(comfy_ltx2.WIDGETS)
RULES.update(comfy_minimaxh3.RULES)  # MiniMax-H3: its sampler, decode and loaders per workflow
WIDGETS.update(comfy_minimaxh3.WIDGETS)

# Folded into their consumers: output 0 is the named input, unchanged on this farm. The nodes
# of comfy_families.SAMPLER_PARAM_NODES (FluxGuidance, ModelSampling*) become a param of the
# sampler downstream (api_format `_sampler_family_params`) and are reported as mapped into it.
FOLDED: dict[str, tuple[str, str, Warn | None]] = {
    name: (port, f"folded into the sampler downstream as its {param!r}", None)
    for name, (port, param) in SAMPLER_PARAM_NODES.items()
}
FOLDED["CFGNorm"] = (
    "model", "Qwen-Image's sampler always rescales its CFG mix to the conditional prediction's "
    "norm (the diffusers pipelines' true CFG, per token, not clamped)",
    lambda values: [] if float(values.get("strength", 1.0)) == 1.0 else
    [f"CFGNorm strength {values.get('strength')} is not honoured (always 1)"],
)

FOLDED["QwenImage21Cache"] = (
    "model", "a speed cache (Qwen-Image 2.1's keys and values of the prompt and references, "
    "kept across steps): the farm's sampler computes them each step, the same image within "
    "rounding", None,
)

FOLDED.update(comfy_ltx2.FOLDED)
FOLDED.update(comfy_minimaxh3.FOLDED)

# Pass one input through when another is unwired (a bypassed node's consumers lose that link):
# type → (the input read instead, the input left unwired). ComfyUI's ImageStitch without an
# image2 returns image1; with both it has no node here and stays unsupported.
PASSED_WHEN_UNWIRED: dict[str, tuple[str, str]] = {"ImageStitch": ("image1", "image2")}

# Cut: consumers get the input unwired, which means the same thing on this farm.
CUT: dict[str, str] = {
    "ConditioningZeroOut": (
        "the farm's sampler builds its own negative (unused at cfg 1, the empty prompt's "
        "otherwise): the sampler's negative input is left unwired"
    ),
    "ImageCompare": (
        "a before/after slider shown in the editor: the farm keeps the images themselves (the "
        "output's takes, the loaded assets)"
    ),
}

UNSUPPORTED: dict[str, str] = {**comfy_ltx2.UNSUPPORTED}

# VAEDecode of a video latent (from these nodes, through samplers): the clip's frames.
VIDEO_DECODE = Rule("vae/decode-video", inputs={"samples": "latent", "vae": "vae"},
                    outputs=("frames",))
VIDEO_LATENTS = frozenset({"latent/empty-video", "wan/image-to-video", "wan/ti2v-latent"})

# Passed through: output slot → the input it is, unchanged, on this farm (none today; LoraLoader's
# CLIP output was one until load/lora applied the text encoder's half).
PASSED: dict[str, dict[int, str]] = {**comfy_ltx2.PASSED}

# Carried: output slot → the input it carries on with something added (a prompt with an image's
# condition, a model with a patch). A sampler's folded params (FluxGuidance, ModelSampling*) are
# looked for through them, and an output whose carried input is cut (a ConditioningZeroOut
# negative) is left unwired with it.
CARRIED: dict[str, dict[int, str]] = {
    "InpaintModelConditioning": {0: "positive", 1: "negative"},
    "DifferentialDiffusion": {0: "model"},
}


