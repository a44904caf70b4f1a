"""ComfyUI's LTX-2 workflows (comfy_extras/nodes_lt.py, nodes_lt_audio.py) → the ltx2/* nodes.
TORCH-FREE.

Not one node to one node: ComfyUI wires a clip as separate video and audio latents joined for
the sampler and split again for the decoders; the farm's ltx2/* nodes carry both in one latent.

    EmptyLTXVLatentVideo (+ LTXVEmptyLatentAudio's frame_rate)  → ltx2/empty-latent
    LTXVImgToVideoInplace (+ LTXVPreprocess's img_compression)  → ltx2/image-to-video (crf)
    LTXVAddGuide (+ LTXVPreprocess's img_compression)           → ltx2/add-guide (crf)
    LTXVConcatAVLatent, LTXVSeparateAVLatent, LTXVConditioning, LTXVCropGuides,
      ModelSamplingLTXV, LTXVEmptyLatentAudio                   → folded (pass their input on)
    SamplerCustomAdvanced (RandomNoise, CFGGuider / LTXVDualCFGGuider / BasicGuider, KSamplerSelect,
      LTXVScheduler / BasicScheduler) or KSampler over the AV latent → ltx2/sample
      (ManualSigmas stays itself, sampling/manual-sigmas: ltx2/sample's sigmas input)
    LatentUpscaleModelLoader, LTXVLatentUpsampler               → load/latent-upscale-model,
                                                                  ltx2/upsample-latent
    CreateVideo of VAEDecode (+ LTXVAudioVAEDecode / VAEDecodeAudio) of the sampled clip
                                                                → ltx2/decode (then video/save)
    CheckpointLoaderSimple, LTXAVTextEncoderLoader, LTXVAudioVAELoader → load/checkpoint of
      ComfyUI's single file where a worker holds it (its configs, tokenizer and Gemma 3 in
      checkpoints/<stem>.diffusers/), else the diffusers LTX2Pipeline folder of its stem
    UNETLoader, VAELoader (video), VAELoader (audio), CLIPLoader type ltxv → ltx2/load-files of
      the four files (the LTX-2.5 templates; each file's configs in its <stem>.diffusers/)
    TextGenerateLTX2Prompt's image                              → left out, with a warning
      (the farm's LTX-2 Gemma 3 reads no images)
    the image of a bypassed LTXVImgToVideoInplace (and what makes only it) → folded with it

`rewrite` settles which nodes take part (per node: a rule, new inputs, or a fold) before the
importer classifies them; api_format applies it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from apps.graphs.nodes import MAX_SEED
from apps.importer.comfy_rules import Link, ParamMap, Rule, linked, readers_of

FAMILY = "ltx2"
# Nodes that exist for LTX-2 only (its audio): a workflow with one is an LTX-2 workflow, and
# the LTXV nodes it shares with LTX-Video 0.9 (EmptyLTXVLatentVideo, LTXVConditioning, …) are
# LTX-2's there.
LTX2_NODES = frozenset({
    "LTXVEmptyLatentAudio", "LTXVConcatAVLatent", "LTXVSeparateAVLatent", "LTXVAudioVAELoader",
    "LTXVAudioVAEDecode", "LTXVAudioVAEEncode", "LTXAVTextEncoderLoader",
})

WIDGETS: dict[str, tuple[str, ...]] = {
    "EmptyLTXVLatentVideo": ("width", "height", "length", "batch_size"),
    "LTXVConditioning": ("frame_rate",),
    "LTXVImgToVideoInplace": ("strength", "bypass"),
    "LTXVAddGuide": ("frame_idx", "strength"),
    "LTXVPreprocess": ("img_compression",),
    "LTXVScheduler": ("steps", "max_shift", "base_shift", "stretch", "terminal"),
    "ModelSamplingLTXV": ("max_shift", "base_shift"),
    "LTXVEmptyLatentAudio": ("frames_number", "frame_rate", "batch_size"),
    "LTXVConcatAVLatent": (),
    "LTXVSeparateAVLatent": (),
    "LTXVCropGuides": (),
    "LTXVAudioVAELoader": ("ckpt_name",),
    "LTXVAudioVAEDecode": (),
    "LTXVAudioVAEEncode": (),
    "VAEDecodeAudio": (),
    "LTXAVTextEncoderLoader": ("text_encoder", "ckpt_name", "device"),
    "LTXVLatentUpsampler": (),
    "LTXVDualCFGGuider": ("video_cfg", "audio_cfg"),
    "LatentUpscaleModelLoader": ("model_name",),
}

# LTX2Pipeline's schedule (its FlowMatchEulerDiscreteScheduler config): ComfyUI's
# LTXVScheduler / ModelSamplingLTXV defaults, which ltx2/sample always uses.
SCHEDULE_DEFAULTS = {"max_shift": 2.05, "base_shift": 0.95, "stretch": True, "terminal": 0.1}
DEFAULT_FPS = 25.0  # LTXVEmptyLatentAudio's / LTXVConditioning's default
_CKPT = "checkpoints"


def _defaults_warning(node: str) -> Callable[[dict[str, Any]], list[str]]:
    def check(values: dict[str, Any]) -> list[str]:
        changed = [f"{k} {values[k]!r}" for k, v in SCHEDULE_DEFAULTS.items()
                   if k in values and not isinstance(values[k], list) and values[k] != v]
        return [f"{', '.join(changed)} ignored: ltx2/sample uses LTX2Pipeline's schedule "
                f"({node}'s defaults)"] if changed else []
    return check


def _batch(values: dict[str, Any]) -> list[str]:
    batch = values.get("batch_size", 1)
    return [] if batch in (1, None) or isinstance(batch, list) else [
        f"batch_size {batch} is ignored: the farm renders one clip per run"]


def _text_encoder(values: dict[str, Any]) -> list[str]:
    name = values.get("text_encoder")
    return [f"text_encoder {name!r} is not loaded: the checkpoint's own Gemma 3 (text_encoder/ "
            "of its folder or of its <stem>.diffusers/) encodes the prompt"
            ] if isinstance(name, str) else []


def _guide_strength(value: Any) -> Any:
    """LTXVAddGuide's strength (ComfyUI: up to 10) held at most 1: above 1 ComfyUI only
    amplifies an attention mask (max(0, 1 − strength) is its noise mask)."""
    return min(float(value), 1.0) if _number(value) is not None else value


def _guide_warnings(values: dict[str, Any]) -> list[str]:
    strength = _number(values.get("strength"))
    return [f"strength {strength:g} is held as 1: above 1 ComfyUI only amplifies an "
            "attention mask"] if strength is not None and strength > 1 else []


def _guide_refusal(values: dict[str, Any]) -> str | None:
    wired = [k for k in ("attention_mask", "iclora_parameters") if isinstance(values.get(k), Link)]
    return (f"its {' and '.join(wired)} {'is' if len(wired) == 1 else 'are'} not built on this "
            "farm yet (ltx2/add-guide guides with the whole image, no IC-LoRA)") if wired else None


RULES: dict[str, Rule] = {
    "EmptyLTXVLatentVideo": Rule(
        "ltx2/empty-latent", outputs=("latent",),
        params={"width": ParamMap("width"), "height": ParamMap("height"),
                "length": ParamMap("length"), "frame_rate": ParamMap("fps", float)},
        warnings=(_batch,),
    ),
    "LTXVImgToVideoInplace": Rule(
        "ltx2/image-to-video", inputs={"vae": "vae", "image": "image", "latent": "latent"},
        outputs=("latent",), params={"img_compression": ParamMap("crf", int),
                                     "strength": ParamMap("strength", float)},
        derive=lambda values: {} if "img_compression" in values else {"crf": 0},
    ),
    "LTXVAddGuide": Rule(
        "ltx2/add-guide", inputs={"positive": "positive", "negative": "negative", "vae": "vae",
                                  "latent": "latent", "image": "image"},
        outputs=("positive", "negative", "latent"),
        params={"frame_idx": ParamMap("frame_idx", int),
                "strength": ParamMap("strength", _guide_strength),
                "img_compression": ParamMap("crf", int)},
        derive=lambda values: {} if "img_compression" in values else {"crf": 0},
        warnings=(_guide_warnings,), refuse=_guide_refusal,
    ),
    "LTXAVTextEncoderLoader": Rule(  # ComfyUI: Gemma 3 + the checkpoint's text projection
        "load/checkpoint", outputs=("encoder",),
        params={"ckpt_name": ParamMap("file", folder=_CKPT)}, warnings=(_text_encoder,),
    ),
    "LatentUpscaleModelLoader": Rule(
        "load/latent-upscale-model", outputs=("latent_upscale_model",),
        params={"model_name": ParamMap("file", folder="latent_upscale_models")},
    ),
    "LTXVLatentUpsampler": Rule(  # its samples: the sampled clip (LTXVSeparateAVLatent folds)
        "ltx2/upsample-latent", outputs=("latent",),
        inputs={"samples": "latent", "upscale_model": "latent_upscale_model", "vae": "vae"},
    ),
    "LTXVAudioVAELoader": Rule(  # the checkpoint's audio VAE + vocoder: ltx2/decode's vae
        "load/checkpoint", outputs=("vae",),
        params={"ckpt_name": ParamMap("file", folder=_CKPT)},
    ),
}
# ComfyUI's separate LTX-2 files (the LTX-2.5 templates): each loader → ltx2/load-files of all
# four files, giving its own output (ComfyUI's UNETLoader MODEL, VAELoader VAE, CLIPLoader CLIP)
FILES_PARAMS = {"unet_name": ParamMap("diffusion_model", folder="diffusion_models"),
                "vae_name": ParamMap("vae", folder="vae"),
                "audio_vae_name": ParamMap("audio_vae", folder="vae"),
                "clip_name": ParamMap("text_encoder", folder="text_encoders")}
FILES_RULES = {comfy_type: Rule("ltx2/load-files", outputs=(output,), params=FILES_PARAMS)
               for comfy_type, output in (("UNETLoader", "model"), ("VAELoader", "vae"),
                                          ("CLIPLoader", "encoder"))}
_AUDIO_READERS = frozenset({"LTXVAudioVAEDecode", "LTXVEmptyLatentAudio", "VAEDecodeAudio"})

# Folded: consumers read the named input instead (comfy_nodes.PASSED routes each output slot).
PASSED: dict[str, dict[int, str]] = {
    "LTXVConcatAVLatent": {0: "video_latent"},
    "LTXVSeparateAVLatent": {0: "av_latent", 1: "av_latent"},
    "LTXVConditioning": {0: "positive", 1: "negative"},
    "LTXVCropGuides": {0: "positive", 1: "negative", 2: "latent"},
    "ModelSamplingLTXV": {0: "model"},
}
FOLDED: dict[str, tuple[str, str, Callable[[dict[str, Any]], list[str]] | None]] = {
    "LTXVConcatAVLatent": ("video_latent", "ltx2/empty-latent makes the clip's video and audio "
                           "latents as one", None),
    "LTXVSeparateAVLatent": ("av_latent", "ltx2/decode decodes the clip's video and audio "
                             "latents together", None),
    "LTXVConditioning": ("positive", "the clip's frame rate is ltx2/empty-latent's fps", None),
    "LTXVCropGuides": ("latent", "ltx2/sample returns the clip without its guides' frames",
                       None),
    "ModelSamplingLTXV": ("model", "ltx2/sample shifts its sigmas by the clip's size as "
                          "LTX2Pipeline does", _defaults_warning("ModelSamplingLTXV")),
    "LTXVEmptyLatentAudio": ("audio_vae", "ltx2/empty-latent makes the clip's audio latent "
                             "(its frame_rate is the clip's fps)", _batch),
}

UNSUPPORTED: dict[str, str] = {
    "LTXVImgToVideo": "LTXVImgToVideo (latent and prompts in one node) is not mapped yet: "
    "wire EmptyLTXVLatentVideo → LTXVImgToVideoInplace instead, as ComfyUI's LTX-2 template "
    "does",
    "LTXVAudioVAEEncode": "LTXVAudioVAEEncode is read only as an LTX-2 clip's given sound "
    "(LTXVConcatAVLatent's audio_latent through SetLatentNoiseMask of a SolidMask 0 or 1: "
    "ltx2/encode-audio)",
    "VAEDecodeAudio": "the farm decodes sound only as part of an LTX-2 clip (ltx2/decode: "
    "CreateVideo of the clip's VAEDecode and its audio decode)",
    "LTXVPreprocess": "LTXVPreprocess is read only as the crf of the LTXVImgToVideoInplace or "
    "LTXVAddGuide it feeds",
    "LTXVScheduler": "LTXVScheduler is read only as the steps of an LTX-2 sampler "
    "(SamplerCustomAdvanced over LTXVConcatAVLatent)",
}

_SAMPLERS = frozenset({"SamplerCustomAdvanced", "KSampler"})
# where a clip's audio latent may come from: an empty one, or a sampled clip's (second stages)
_SOUND_SOURCES = frozenset({"LTXVEmptyLatentAudio", "LTXVSeparateAVLatent"})
_FRAME_DECODES = frozenset({"VAEDecode", "VAEDecodeTiled"})
_AUDIO_DECODES = frozenset({"LTXVAudioVAEDecode", "VAEDecodeAudio"})
_SAMPLE_RULE_INPUTS = {"model": "model", "positive": "positive", "negative": "negative",
                       "latent": "latent", "sigmas": "sigmas"}


def _fixed_guidance(values: dict[str, Any]) -> dict[str, Any]:
    """ComfyUI's CFGGuider mixes the joint prediction with one cfg: the same CFG on video and
    sound (api_format copies `cfg` to `audio_cfg`; LTXVDualCFGGuider gives each its own), no
    STG, modality guidance or rescale."""
    return {"stg": 0.0, "audio_stg": 0.0, "modality": 1.0, "audio_modality": 1.0,
            "rescale": 0.0, "audio_rescale": 0.0}


def _seed(value: Any) -> Any:
    """comfy_nodes' wrap of ComfyUI's 64-bit seeds into ours (2⁵³−1)."""
    return value % (MAX_SEED + 1) if isinstance(value, int) and value > MAX_SEED else value


def sample_rule(outputs: tuple[str | None, ...],
                warnings: tuple[Callable[[dict[str, Any]], list[str]], ...]) -> Rule:
    return Rule("ltx2/sample", inputs=_SAMPLE_RULE_INPUTS, outputs=outputs,
                params={"seed": ParamMap("seed", _seed), "steps": ParamMap("steps"),
                        "cfg": ParamMap("cfg", float), "audio_cfg": ParamMap("audio_cfg", float)},
                derive=_fixed_guidance, warnings=warnings)


ENCODE_AUDIO_RULE = Rule(
    "ltx2/encode-audio", inputs={"audio_vae": "vae", "audio": "audio", "video_latent": "latent"},
    outputs=("latent",), params={"keep": ParamMap("keep", bool)},
)
GIVEN = "the clip's sound is given: ltx2/encode-audio {} encodes it and keeps it"


def _given_sound(out: Rewrite, node: Any, concat: tuple[str, dict[str, Any]],
                 masked: tuple[str, str, dict[str, Any]]) -> str | None:
    """A clip whose sound is given (ComfyUI's LTXVAudioVAEEncode → SetLatentNoiseMask of a
    SolidMask → LTXVConcatAVLatent's audio_latent): the concat becomes ltx2/encode-audio of
    the video latent, the sound and the audio VAE, kept at mask 0 and only a start at mask 1;
    the encode, the mask and the SolidMask fold into it. Returns why not, else None."""
    encoded, solid = node(masked[2].get("samples")), node(masked[2].get("mask"))
    if encoded is None or encoded[1] != "LTXVAudioVAEEncode":
        return (f"its audio latent is SetLatentNoiseMask {masked[0]} of "
                f"{encoded[1] if encoded else 'nothing'}: an LTX-2 clip's sound is given as "
                "LTXVAudioVAEEncode of a sound track")
    if solid is None or solid[1] != "SolidMask":
        return (f"its sound's noise mask is {solid[1] if solid else 'not wired'}: "
                "ltx2/encode-audio takes a SolidMask of 0 (the sound kept) or 1 (a start)")
    value = _number(solid[2].get("value"))
    if value not in (0.0, 1.0):
        return (f"its sound's noise mask is a SolidMask of value {solid[2].get('value')!r}: "
                "ltx2/encode-audio keeps a sound whole (mask 0) or starts from it whole (mask "
                "1); a partial sound mask is not built on this farm")
    nid, inputs = concat
    out.rules[nid] = ENCODE_AUDIO_RULE
    out.inputs[nid] = {"video_latent": inputs.get("video_latent"),
                       "audio": encoded[2].get("audio"),
                       "audio_vae": encoded[2].get("audio_vae"), "keep": value == 0.0}
    for folded in (masked[0], encoded[0], solid[0]):
        out.folded[folded] = GIVEN.format(nid)
    return None


def _conditioning_rate(nodes: dict[str, tuple[str, dict[str, Any]]]) -> Any:
    """The clip's frame rate where no audio latent says it: LTXVConditioning's frame_rate (a
    value or the link that gives it), when the workflow's agree; else DEFAULT_FPS."""
    rates = {repr(inputs.get("frame_rate", DEFAULT_FPS)): inputs.get("frame_rate", DEFAULT_FPS)
             for comfy_type, inputs in nodes.values() if comfy_type == "LTXVConditioning"}
    return next(iter(rates.values())) if len(rates) == 1 else DEFAULT_FPS


DECODE_RULE = Rule("ltx2/decode", inputs={"vae": "vae", "samples": "latent"}, outputs=("video",))


@dataclass
class Rewrite:
    """What `rewrite` settled: per node a rule and its new inputs (ComfyUI names, links kept),
    folds (reason), refusals (reason), warnings, and the LTX-2 checkpoint loaders."""

    rules: dict[str, Rule] = field(default_factory=dict)
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    folded: dict[str, str] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    warnings: list[tuple[str, str, str]] = field(default_factory=list)
    loaders: set[str] = field(default_factory=set)
    passed: dict[str, str] = field(default_factory=dict)  # a node whose output is this input


def is_ltx2(nodes: dict[str, tuple[str, dict[str, Any]]]) -> bool:
    return any(comfy_type in LTX2_NODES for comfy_type, _ in nodes.values())


def rewrite(nodes: dict[str, tuple[str, dict[str, Any]]]) -> Rewrite:
    """Settle an LTX-2 workflow's samplers, latents and decodes (see the module doc). `nodes`:
    id → (class_type, inputs with api_format Links)."""
    out = Rewrite()
    if not is_ltx2(nodes):
        return out

    def node(link: Any) -> tuple[str, str, dict[str, Any]] | None:
        return linked(nodes, link)

    def through(link: Any) -> Any:
        """Follow the folded LTX-2 nodes (PASSED) up to the real output."""
        for _ in range(len(nodes) + 1):
            if not isinstance(link, Link):
                return link
            comfy_type, inputs = nodes[link.node]
            port = PASSED.get(comfy_type, {}).get(link.slot)
            if port is None:
                return link
            link = inputs.get(port)
        return None

    def sampled_by(link: Any) -> Any:
        """`through`, then up an LTXVLatentUpsampler's samples: the link to the sampler whose
        clip this is (an upsampled clip is still its sampler's)."""
        for _ in range(len(nodes) + 1):
            link = through(link)
            if not isinstance(link, Link) or nodes[link.node][0] != "LTXVLatentUpsampler":
                return link
            link = nodes[link.node][1].get("samples")
        return None

    def av_concat(link: Any) -> tuple[str, dict[str, Any]] | None:
        """The LTXVConcatAVLatent a sampler's latent is (through LTXVCropGuides)."""
        for _ in range(len(nodes) + 1):
            found = node(link)
            if found is None:
                return None
            nid, comfy_type, inputs = found
            if comfy_type == "LTXVConcatAVLatent":
                return nid, inputs
            if comfy_type != "LTXVCropGuides":
                return None
            link = inputs.get("latent")
        return None

    readers = readers_of(nodes)

    samplers: dict[str, float | None] = {}  # sampler id → its clip's fps (when known)
    for nid, (comfy_type, inputs) in nodes.items():
        if comfy_type not in _SAMPLERS:
            continue
        concat = av_concat(inputs.get("latent_image"))
        if concat is None:
            continue
        fps = _clip(nodes, out, node, concat[1])
        samplers[nid] = fps
        sound = node(concat[1].get("audio_latent"))
        why = (_given_sound(out, node, concat, sound) if sound is not None
               and sound[1] == "SetLatentNoiseMask" else None)
        if sound is not None and sound[1] not in _SOUND_SOURCES | {"SetLatentNoiseMask"}:
            why = (f"its audio latent comes from {sound[1]}: ltx2/sample draws the clip's sound "
                   "from noise, refines a sampled clip's, or keeps a given one (LTXVAudioVAEEncode"
                   " → SetLatentNoiseMask of a SolidMask)")
        if why is not None:
            out.refused[nid] = why
            continue
        if comfy_type == "KSampler":
            _ksampler(out, nid, inputs)
        else:
            _custom_advanced(out, nodes, node, readers, nid, inputs)

    for nid, (comfy_type, inputs) in nodes.items():
        if comfy_type == "CreateVideo":
            _create_video(out, nodes, node, sampled_by, readers, samplers, nid, inputs)
    for nid, (comfy_type, inputs) in nodes.items():  # decodes read by no clip: refused
        sampled = sampled_by(inputs.get("samples"))
        if (comfy_type in _FRAME_DECODES | _AUDIO_DECODES and nid not in out.folded
                and isinstance(sampled, Link) and sampled.node in samplers):
            what = "frames" if comfy_type in _FRAME_DECODES else "sound"
            out.refused[nid] = (f"an LTX-2 clip's {what} alone are not decoded on this farm: "
                                "ltx2/decode makes the clip with its sound (wire it into "
                                "CreateVideo → SaveVideo)")
    _loaders(out, nodes, readers, {f for f in samplers.values() if f is not None})
    _enhancer_images(out, nodes)
    _bypassed_images(out, nodes, readers)
    return out


BYPASSED = "it makes only the image of a bypassed LTXVImgToVideoInplace, which is not used"


def _bypassed_images(out: Rewrite, nodes: dict[str, tuple[str, dict[str, Any]]],
                     readers: dict[str, list[str]]) -> None:
    """The nodes that make only a bypassed LTXVImgToVideoInplace's image (the text-to-video
    templates' EmptyImage → resizes → LTXVPreprocess) are folded away with it: nothing reads
    what they make."""
    def unread(reader: str, source: str) -> bool:  # folded, and not passing `source` on
        comfy_type, inputs = nodes[reader]
        passed = {out.passed.get(reader), *PASSED.get(comfy_type, {}).values()}
        return reader in out.folded and not any(
            isinstance(v, Link) and v.node == source for k, v in inputs.items() if k in passed)

    pending = [inputs.get("image") for nid, (comfy_type, inputs) in nodes.items()
               if comfy_type == "LTXVImgToVideoInplace" and nid in out.folded]
    while pending:
        link = pending.pop()
        if not isinstance(link, Link) or link.node in out.folded or not all(
                unread(r, link.node) for r in readers.get(link.node, [])):
            continue
        out.folded[link.node] = BYPASSED
        pending.extend(v for v in nodes[link.node][1].values() if isinstance(v, Link))


def _enhancer_images(out: Rewrite, nodes: dict[str, tuple[str, dict[str, Any]]]) -> None:
    """TextGenerateLTX2Prompt's image is left out, with a warning: ComfyUI shows it to Gemma
    3's vision tower, and the farm's LTX-2 Gemma reads no images (no image processor in its
    folders), so the prompt is enhanced from its text alone and the clip renders (an
    image-to-video clip still starts from its image; refusing would block the template)."""
    for nid, (comfy_type, inputs) in nodes.items():
        if comfy_type == "TextGenerateLTX2Prompt" and isinstance(inputs.get("image"), Link):
            out.inputs[nid] = {k: v for k, v in inputs.items() if k != "image"}
            out.warnings.append((nid, comfy_type, (
                f"its image (node {inputs['image'].node}) is not passed to Gemma 3: the farm's "
                "LTX-2 text encoder reads no images, so the prompt is enhanced from its text "
                "alone (the clip's own image conditioning is unchanged)")))


def _loaders(out: Rewrite, nodes: dict[str, tuple[str, dict[str, Any]]],
             readers: dict[str, list[str]], clip_fps: set[float]) -> None:
    """The checkpoint loaders (a text-encoder loader of type `ltxv` reads the checkpoint's own
    encoder too), or ComfyUI's separate files (`_files`); LTXVConditioning's frame_rate against
    the clip's fps."""
    checkpoints = [inputs.get("ckpt_name") for comfy_type, inputs in nodes.values()
                   if comfy_type == "CheckpointLoaderSimple"]
    files = None if checkpoints else _files(nodes, readers)
    for nid, (comfy_type, inputs) in nodes.items():
        if comfy_type in ("CheckpointLoaderSimple", "LTXAVTextEncoderLoader",
                          "LTXVAudioVAELoader"):
            out.loaders.add(nid)
        if comfy_type == "LTXVAudioVAELoader" and nid not in _read_by_rules(out) and all(
                r in out.folded or nodes[r][0] in FOLDED for r in readers.get(nid, [])):
            out.folded[nid] = ("the checkpoint's audio VAE and vocoder decode the sound in "
                               "ltx2/decode (its vae input)")
        if files is not None and nid in files[1]:
            out.rules[nid], out.inputs[nid] = FILES_RULES[comfy_type], files[0]
            out.loaders.add(nid)
        elif (comfy_type in ("CLIPLoader", "DualCLIPLoader") and inputs.get("type") == "ltxv"
              and files is None):  # beside the files: a prompt enhancer's (the generic rule)
            _ltxv_clip(out, nid, comfy_type, inputs, checkpoints)
        rate = _number(inputs.get("frame_rate")) if comfy_type == "LTXVConditioning" else None
        if rate is not None and clip_fps and rate not in clip_fps:
            out.warnings.append((nid, comfy_type, f"frame_rate {rate:g} is not the clip's fps "
                                 f"({', '.join(f'{f:g}' for f in sorted(clip_fps))}: "
                                 "LTXVEmptyLatentAudio's frame_rate), which is used"))


def _read_by_rules(out: Rewrite) -> set[str]:
    """The nodes that the rewrite's own rules read (ltx2/encode-audio's audio VAE loader)."""
    return {v.node for nid in out.rules for v in out.inputs.get(nid, {}).values()
            if isinstance(v, Link)}


def _ltxv_clip(out: Rewrite, nid: str, comfy_type: str, inputs: dict[str, Any],
               checkpoints: list[Any]) -> None:
    """A text-encoder loader of type `ltxv` beside a checkpoint: the checkpoint's encoder."""
    if not checkpoints or not isinstance(checkpoints[0], str):
        out.refused[nid] = ("LTX-2's text encoder loads with its model: load the checkpoint "
                            "with CheckpointLoaderSimple, or the separate files with one "
                            "UNETLoader, a VAELoader each for the video and the audio VAE and "
                            "this CLIPLoader")
        return
    names = [v for k, v in inputs.items() if k.startswith("clip_name")]
    out.rules[nid] = RULES["LTXAVTextEncoderLoader"]
    out.inputs[nid] = {"ckpt_name": checkpoints[0]}
    out.loaders.add(nid)
    out.warnings.append((nid, comfy_type, f"{' + '.join(map(str, names))} not loaded: "
                         "the checkpoint's own Gemma 3 encodes the prompt"))


def _files(nodes: dict[str, tuple[str, dict[str, Any]]], readers: dict[str, list[str]]
           ) -> tuple[dict[str, Any], set[str]] | None:
    """ComfyUI's separate LTX-2 files, when the workflow has one UNETLoader, one VAELoader read
    by the audio nodes (the audio VAE), one other (the video VAE) and one CLIPLoader of type
    `ltxv` read by a text encode: (ltx2/load-files' inputs, those loaders' ids and the audio
    VAE's), else None. A `ltxv` CLIPLoader read only by a prompt enhancer is not one of them."""
    def of(comfy_type: str) -> list[str]:
        return [nid for nid, (t, _) in nodes.items() if t == comfy_type]

    vaes = of("VAELoader")
    audio = [v for v in vaes if any(nodes[r][0] in _AUDIO_READERS for r in readers.get(v, []))]
    clips = [c for c in of("CLIPLoader") if nodes[c][1].get("type") == "ltxv"
             and any(nodes[r][0] == "CLIPTextEncode" for r in readers.get(c, []))]
    unets, video = of("UNETLoader"), [v for v in vaes if v not in audio]
    if not all(len(found) == 1 for found in (unets, audio, video, clips)):
        return None
    names = {"unet_name": nodes[unets[0]][1].get("unet_name"),
             "vae_name": nodes[video[0]][1].get("vae_name"),
             "audio_vae_name": nodes[audio[0]][1].get("vae_name"),
             "clip_name": nodes[clips[0]][1].get("clip_name")}
    if not all(isinstance(name, str) for name in names.values()):
        return None
    return names, {unets[0], video[0], audio[0], clips[0]}


def _fixed_bool(nodes: dict[str, tuple[str, dict[str, Any]]], value: Any) -> bool | None:
    """A boolean input the workflow fixes: its value, or a PrimitiveBoolean's it is wired to."""
    if isinstance(value, Link) and nodes[value.node][0] == "PrimitiveBoolean":
        value = nodes[value.node][1].get("value")
    return value if isinstance(value, bool) else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _clip(nodes: dict[str, tuple[str, dict[str, Any]]], out: Rewrite, node: Any,
          concat: dict[str, Any]) -> float | None:
    """The clip's latent nodes: EmptyLTXVLatentVideo gets the audio latent's frame_rate,
    LTXVImgToVideoInplace (bypass: folded away) and LTXVAddGuide their LTXVPreprocess's
    img_compression."""
    audio = node(concat.get("audio_latent"))
    frame_rate: Any = DEFAULT_FPS
    frames = None
    if audio is not None and audio[1] == "LTXVEmptyLatentAudio":
        frame_rate = audio[2].get("frame_rate", DEFAULT_FPS)
        frames = audio[2].get("frames_number")
    elif audio is not None and audio[1] == "SetLatentNoiseMask":  # a given sound: no audio
        frame_rate = _conditioning_rate(nodes)  # latent's frame_rate, LTXVConditioning's
    link = concat.get("video_latent")
    for _ in range(len(nodes) + 1):
        found = node(link)
        if found is None:
            return None
        nid, comfy_type, inputs = found
        if comfy_type == "LTXVImgToVideoInplace":
            bypass = _fixed_bool(nodes, inputs.get("bypass"))
            if bypass:  # the text-to-video templates bypass their image this way
                out.folded[nid] = "bypass: ComfyUI passes the latent on unchanged"
                out.passed[nid] = "latent"
                link = inputs.get("latent")
                continue
            out.inputs[nid] = {**inputs, "bypass": bypass}
            _preprocessed(out, node, nid, "ltx2/image-to-video")
            link = inputs.get("latent")
            continue
        if comfy_type == "LTXVAddGuide":
            out.inputs[nid] = dict(inputs)
            _preprocessed(out, node, nid, "ltx2/add-guide")
            link = inputs.get("latent")
            continue
        if comfy_type != "EmptyLTXVLatentVideo":
            return None
        length = inputs.get("length")
        if _number(frames) is not None and _number(length) is not None and frames != length:
            out.warnings.append((nid, comfy_type, f"the audio latent's frames_number {frames} "
                                 f"is not the clip's length {length}: the sound lasts the clip"))
        out.inputs[nid] = {**inputs, "frame_rate": frame_rate}
        return _number(frame_rate)
    return None


def _preprocessed(out: Rewrite, node: Any, nid: str, ours: str) -> None:
    """An LTXVPreprocess feeding node `nid`'s image folds into its crf (its img_compression)."""
    image = node(out.inputs[nid].get("image"))
    if image is not None and image[1] == "LTXVPreprocess":
        out.folded[image[0]] = f"its H.264 re-compression is {ours} {nid}'s crf"
        out.inputs[nid] |= {"image": image[2].get("image"),
                            "img_compression": image[2].get("img_compression", 33)}


def _sampler_warning(values: dict[str, Any]) -> list[str]:
    found = []
    sampler, scheduler = values.get("sampler_name"), values.get("scheduler")
    if isinstance(sampler, str) and sampler != "euler":
        found.append(f"sampler {sampler!r} is not used: ltx2/sample steps LTX2Pipeline's flow "
                     "Euler")
    if isinstance(scheduler, str):
        found.append(f"scheduler {scheduler!r} is not used: ltx2/sample uses LTX2Pipeline's "
                     "resolution-shifted schedule")
    denoise = values.get("denoise", 1.0)
    if isinstance(denoise, int | float) and denoise != 1.0:
        found.append(f"denoise {denoise} is not honoured: ltx2/sample denoises the whole clip")
    return found


def _ksampler(out: Rewrite, nid: str, inputs: dict[str, Any]) -> None:
    out.rules[nid] = sample_rule(("latent",), (_sampler_warning,))
    out.inputs[nid] = {"model": inputs.get("model"), "positive": inputs.get("positive"),
                       "negative": inputs.get("negative"), "latent": inputs.get("latent_image"),
                       **{k: inputs[k] for k in ("seed", "steps", "cfg", "sampler_name",
                                                 "scheduler", "denoise") if k in inputs}}


def _custom_advanced(out: Rewrite, nodes: dict[str, tuple[str, dict[str, Any]]], node: Any,
                     readers: dict[str, list[str]], nid: str, inputs: dict[str, Any]) -> None:
    """SamplerCustomAdvanced's noise, guider, sampler and sigmas nodes → ltx2/sample's seed,
    cfg, steps (each folded when only LTX-2 samplers read it); ManualSigmas is wired into its
    sigmas input instead."""
    new: dict[str, Any] = {"latent": inputs.get("latent_image")}
    parts = {port: node(inputs.get(port)) for port in ("noise", "guider", "sampler", "sigmas")}
    warned: list[str] = []
    noise, guider, sampler, sigmas = (parts[p] for p in ("noise", "guider", "sampler", "sigmas"))
    if noise is None or noise[1] != "RandomNoise":
        out.refused[nid] = ("ltx2/sample draws its own noise from a seed: wire RandomNoise into "
                            "its noise input")
        return
    new["seed"] = noise[2].get("noise_seed", 0)
    if guider is not None and guider[1] == "CFGGuider":
        new.update(model=guider[2].get("model"), positive=guider[2].get("positive"),
                   negative=guider[2].get("negative"), cfg=guider[2].get("cfg", 1.0))
    elif guider is not None and guider[1] == "LTXVDualCFGGuider":  # CFG, a scale per modality
        new.update(model=guider[2].get("model"), positive=guider[2].get("positive"),
                   negative=guider[2].get("negative"), cfg=guider[2].get("video_cfg", 3.0),
                   audio_cfg=guider[2].get("audio_cfg", 7.0))
    elif guider is not None and guider[1] == "BasicGuider":
        new.update(model=guider[2].get("model"), positive=guider[2].get("conditioning"), cfg=1.0)
    else:
        got = guider[1] if guider is not None else "nothing"
        out.refused[nid] = (f"its guider is {got}: ltx2/sample takes CFGGuider's, "
                            "LTXVDualCFGGuider's or BasicGuider's model, prompts and cfg")
        return
    if sampler is not None and sampler[1] == "KSamplerSelect":
        name = sampler[2].get("sampler_name")
        if isinstance(name, str) and name != "euler":
            warned.append(f"sampler {name!r} is not used: ltx2/sample steps LTX2Pipeline's "
                          "flow Euler")
    if sigmas is not None and sigmas[1] == "ManualSigmas":  # mapped itself: the wired sigmas
        new["sigmas"] = inputs.get("sigmas")
        parts.pop("sigmas")
    elif sigmas is not None and sigmas[1] in ("LTXVScheduler", "BasicScheduler"):
        new["steps"] = sigmas[2].get("steps", 20)
        if sigmas[1] == "LTXVScheduler":
            warned += _defaults_warning("LTXVScheduler")(sigmas[2])
        else:
            warned.append(f"scheduler {sigmas[2].get('scheduler')!r} is not used: ltx2/sample "
                          "uses LTX2Pipeline's resolution-shifted schedule")
    else:
        got = sigmas[1] if sigmas is not None else "nothing"
        out.refused[nid] = (f"its sigmas come from {got}: ltx2/sample takes ManualSigmas' "
                            "sigmas or LTXVScheduler's (or BasicScheduler's) steps")
        return
    roles = {"noise": "its noise_seed is ltx2/sample {}'s seed",
             "guider": "its model, prompts and cfg are ltx2/sample {}'s",
             "sampler": "ltx2/sample {} steps LTX2Pipeline's flow Euler",
             "sigmas": "its steps are ltx2/sample {}'s (LTX2Pipeline's schedule)"}
    for role, part in parts.items():
        if part is not None and all(r == nid or nodes[r][0] in _SAMPLERS
                                    for r in readers.get(part[0], [])):
            out.folded[part[0]] = roles[role].format(nid)
    out.rules[nid] = sample_rule(("latent", "latent"), ())
    out.inputs[nid] = new
    out.warnings += [(nid, "SamplerCustomAdvanced", message) for message in warned]


def _create_video(out: Rewrite, nodes: dict[str, tuple[str, dict[str, Any]]], node: Any,
                  sampled_by: Any, readers: dict[str, list[str]],
                  samplers: dict[str, float | None],
                  nid: str, inputs: dict[str, Any]) -> None:
    """CreateVideo of an LTX-2 clip's decoded frames (and sound) → ltx2/decode."""
    frames = node(inputs.get("images"))
    if frames is None or frames[1] not in _FRAME_DECODES:
        return
    sampled = sampled_by(frames[2].get("samples"))
    if not isinstance(sampled, Link) or sampled.node not in samplers:
        return
    out.rules[nid] = DECODE_RULE
    out.inputs[nid] = {"vae": frames[2].get("vae"), "samples": frames[2].get("samples")}
    decodes = [frames]
    audio = node(inputs.get("audio"))
    if audio is not None and audio[1] in _AUDIO_DECODES:
        decodes.append(audio)
    elif audio is None:
        out.warnings.append((nid, "CreateVideo", "no audio is wired: ltx2/decode keeps the "
                             "clip's own sound"))
    for decode in decodes:  # read by clips only: folded; else refused (rewrite's last loop)
        if all(nodes[r][0] == "CreateVideo" for r in readers.get(decode[0], [])):
            out.folded.setdefault(decode[0], f"decoded with the clip by ltx2/decode {nid}")
    fps, clip_fps = _number(inputs.get("fps")), samplers[sampled.node]
    if fps is not None and clip_fps is not None and fps != clip_fps:
        out.warnings.append((nid, "CreateVideo", f"fps {fps:g} is not the clip's {clip_fps:g} "
                             "(LTXVEmptyLatentAudio's frame_rate): the clip keeps its own"))

