"""ComfyUI's MiniMax-H3 workflows (its templates' "Image to Video (MiniMax H3)" subgraph) → the
minimaxh3/* nodes. TORCH-FREE.

    MiniMaxH3ImageToVideo (clip, vae, prompt, width, height, length, first / last frame)
                                                    → minimaxh3/image-to-video
    MiniMaxH3ReferenceToVideo (clip, vae, prompt, width, height, length, ref_image_size,
      ref_images.ref_image_0..8)                    → minimaxh3/reference-to-video (image1..9,
      mode); a wired reference video or audio is refused
    SamplerCustomAdvanced over its latent (RandomNoise, BasicGuider, KSamplerSelect,
      BasicScheduler; MiniMaxH3SigmaShift on the model's path: its shifts)
                                                    → minimaxh3/sample (seed, steps); a sampler
      other than euler (the templates' res_multistep) or a scheduler is named in a warning:
      minimaxh3/sample steps the pipeline's Euler on its own two schedules
    CreateVideo of VAEDecode (+ VAEDecodeAudio) of the sampled clip → minimaxh3/decode
    BlockSparseAttention, ModelAttentionBackend (FastH3's speed paths) → folded: dense
      attention, the worker's kernel
    UNETLoader, VAELoader (video), VAELoader (audio: read by VAEDecodeAudio), CLIPLoader type
      minimax                                       → minimaxh3/load-files of the four parts

`rewrite` adds its settlements to the LTX-2 rewrite's (comfy_ltx2.Rewrite), which api_format
applies.
"""

from __future__ import annotations

from typing import Any

from apps.importer.comfy_ltx2 import Rewrite, _seed
from apps.importer.comfy_rules import Link, Nodes, ParamMap, Rule, linked, readers_of

FAMILY = "minimaxh3"
CLIP_TYPE = "minimax"  # ComfyUI's CLIPLoader type of MiniMax-H3's Qwen3-VL
FPS = 24.0
H3_NODES = frozenset({"MiniMaxH3ImageToVideo", "MiniMaxH3ReferenceToVideo"})
MAX_REFERENCES = 9
_MEDIA_REFERENCES = ("ref_videos.", "ref_video_audios.", "ref_audios.")

WIDGETS: dict[str, tuple[str, ...]] = {
    "MiniMaxH3ImageToVideo": ("prompt", "width", "height", "length"),
    "MiniMaxH3SigmaShift": ("shift_video", "shift_audio"),
    "MiniMaxH3ReferenceToVideo": ("prompt", "width", "height", "length", "ref_image_size"),
}


def _media_references(values: dict[str, Any]) -> str | None:
    wired = sorted(name for name, value in values.items()
                   if name.startswith(_MEDIA_REFERENCES) and value is not None)
    if not wired:
        return None
    return (f"its reference videos and sounds ({', '.join(wired)}) are not conditioned on by "
            "this farm yet: minimaxh3/reference-to-video takes reference images")


RULES: dict[str, Rule] = {
    "MiniMaxH3ImageToVideo": Rule(
        "minimaxh3/image-to-video",
        inputs={"clip": "encoder", "vae": "vae", "first_frame": "first_frame",
                "last_frame": "last_frame"},
        outputs=("positive", "latent"),
        params={"prompt": ParamMap("prompt", str), "width": ParamMap("width", int),
                "height": ParamMap("height", int), "length": ParamMap("length", int)},
        refuse=lambda values: None if values.get("context_latent") is None else (
            "its context_latent (continuing a prior clip) is not built on this farm yet: "
            "minimaxh3/image-to-video takes a first and a last frame"),
    ),
    "MiniMaxH3ReferenceToVideo": Rule(
        "minimaxh3/reference-to-video",
        inputs={"clip": "encoder", "vae": "vae",
                **{f"ref_images.ref_image_{i}": f"image{i + 1}" for i in range(MAX_REFERENCES)}},
        outputs=("positive", "latent"),
        params={"prompt": ParamMap("prompt", str), "width": ParamMap("width", int),
                "height": ParamMap("height", int), "length": ParamMap("length", int),
                "ref_image_size": ParamMap("mode", str)},
        refuse=_media_references,
    ),
}
SAMPLE_RULE = Rule("minimaxh3/sample",
                   inputs={"model": "model", "positive": "positive", "latent": "latent"},
                   outputs=("latent", "latent"),
                   params={"seed": ParamMap("seed", _seed), "steps": ParamMap("steps", int),
                           "shift_video": ParamMap("shift_video", float),
                           "shift_audio": ParamMap("shift_audio", float)})
SHIFT = "MiniMaxH3SigmaShift"
# Folded into their consumers (output 0: the model unchanged): (input, why, warning).
FOLDED: dict[str, tuple[str, str, Any]] = {
    SHIFT: ("model", "its shift_video and shift_audio are minimaxh3/sample's", None),
    "BlockSparseAttention": (
        "model", "a speed path (FastVideo's block-sparse attention): the farm's transformer "
        "attends to every token — the clip the sparse kernel approximates, at dense speed",
        None),
    "ModelAttentionBackend": (
        "model", "the attention kernel is the worker's own choice (INLINE_ATTENTION)", None),
}
DECODE_RULE = Rule("minimaxh3/decode", inputs={"vae": "vae", "samples": "latent"},
                   outputs=("video",))
FILES_PARAMS = {"unet_name": ParamMap("diffusion_model", folder="diffusion_models"),
                "vae_name": ParamMap("vae", folder="vae"),
                "audio_vae_name": ParamMap("audio_vae", folder="vae"),
                "clip_name": ParamMap("text_encoder", folder="text_encoders")}
FILES_RULES = {comfy_type: Rule("minimaxh3/load-files", outputs=(output,), params=FILES_PARAMS)
               for comfy_type, output in (("UNETLoader", "model"), ("VAELoader", "vae"),
                                          ("CLIPLoader", "encoder"))}
_FRAME_DECODES = frozenset({"VAEDecode", "VAEDecodeTiled"})

def is_minimaxh3(nodes: Nodes) -> bool:
    return any(comfy_type in H3_NODES for comfy_type, _ in nodes.values())


def rewrite(nodes: Nodes, out: Rewrite) -> Rewrite:
    """Settle a MiniMax-H3 workflow's samplers, decodes and loaders (see the module doc) into
    `out`. `nodes`: id → (class_type, inputs with api_format Links)."""
    if not is_minimaxh3(nodes):
        return out

    def node(link: Any) -> tuple[str, str, dict[str, Any]] | None:
        return linked(nodes, link)

    readers = readers_of(nodes)
    samplers = set()
    for nid, (comfy_type, inputs) in nodes.items():
        latent = node(inputs.get("latent_image"))
        if comfy_type == "SamplerCustomAdvanced" and latent is not None \
                and latent[1] in H3_NODES:
            _sampler(out, nodes, node, readers, nid, inputs)
            samplers.add(nid)
    for nid, (comfy_type, inputs) in nodes.items():
        if comfy_type == "CreateVideo":
            _create_video(out, nodes, node, readers, samplers, nid, inputs)
    for nid, (comfy_type, inputs) in nodes.items():  # decodes read by no clip: refused
        sampled = inputs.get("samples")
        if (comfy_type in _FRAME_DECODES | {"VAEDecodeAudio"} and nid not in out.folded
                and isinstance(sampled, Link) and sampled.node in samplers):
            out.refused[nid] = ("a MiniMax-H3 clip's frames or sound alone are not decoded on "
                                "this farm: minimaxh3/decode makes the clip with its sound (wire "
                                "it into CreateVideo → SaveVideo)")
    _loaders(out, nodes, readers)
    return out


def _sampler(out: Rewrite, nodes: Nodes, node: Any, readers: dict[str, list[str]], nid: str,
             inputs: dict[str, Any]) -> None:
    """SamplerCustomAdvanced's noise, guider, sampler and sigmas → minimaxh3/sample's seed,
    model, prompt and steps (each folded when only samplers read it)."""
    new: dict[str, Any] = {"latent": inputs.get("latent_image")}
    parts = {port: node(inputs.get(port)) for port in ("noise", "guider", "sampler", "sigmas")}
    noise, guider, sampler, sigmas = (parts[p] for p in ("noise", "guider", "sampler", "sigmas"))
    if noise is None or noise[1] != "RandomNoise":
        out.refused[nid] = ("minimaxh3/sample draws its own noise from a seed: wire RandomNoise "
                            "into its noise input")
        return
    if guider is None or guider[1] != "BasicGuider":
        got = guider[1] if guider is not None else "nothing"
        out.refused[nid] = (f"its guider is {got}: minimaxh3/sample takes BasicGuider's model and "
                            "prompt (MiniMax-H3 is guidance-distilled: one pass per step)")
        return
    if sigmas is None or sigmas[1] != "BasicScheduler":
        got = sigmas[1] if sigmas is not None else "nothing"
        out.refused[nid] = (f"its sigmas come from {got}: minimaxh3/sample takes "
                            "BasicScheduler's steps (its own schedule)")
        return
    new.update(seed=noise[2].get("noise_seed", 0), model=guider[2].get("model"),
               positive=guider[2].get("conditioning"), steps=sigmas[2].get("steps", 20))
    shift = _shift(nodes, guider[2].get("model"))
    if shift is not None:
        new.update(shift_video=shift.get("shift_video", 12.0),
                   shift_audio=shift.get("shift_audio", 3.0))
    warned = [f"scheduler {sigmas[2].get('scheduler')!r} is not used: minimaxh3/sample uses "
              "MiniMaxH3ModularPipeline's schedule (its shifts: 12 for video, 3 for sound "
              "unless a MiniMaxH3SigmaShift sets them)"]
    denoise = sigmas[2].get("denoise", 1.0)
    if isinstance(denoise, int | float) and denoise != 1.0:
        warned.append(f"denoise {denoise} is not honoured: minimaxh3/sample denoises the whole "
                      "clip")
    name = sampler[2].get("sampler_name") if sampler is not None else None
    if isinstance(name, str) and name != "euler":
        warned.append(f"sampler {name!r} is not used: minimaxh3/sample steps "
                      "MiniMaxH3ModularPipeline's Euler (its MiniMaxH3Scheduler)")
    roles = {"noise": "its noise_seed is minimaxh3/sample {}'s seed",
             "guider": "its model and prompt are minimaxh3/sample {}'s",
             "sampler": "minimaxh3/sample {} steps the pipeline's Euler",
             "sigmas": "its steps are minimaxh3/sample {}'s (the pipeline's schedule)"}
    for role, part in parts.items():
        if part is not None and all(r == nid or nodes[r][0] == "SamplerCustomAdvanced"
                                    for r in readers.get(part[0], [])):
            out.folded[part[0]] = roles[role].format(nid)
    out.rules[nid], out.inputs[nid] = SAMPLE_RULE, new
    out.warnings += [(nid, "SamplerCustomAdvanced", message) for message in warned]


def _shift(nodes: Nodes, model: Any) -> dict[str, Any] | None:
    """The inputs of the nearest MiniMaxH3SigmaShift up the model's path (through the nodes
    that hand a model on: LoRAs, the folded attention nodes), else None."""
    for _ in range(len(nodes)):
        if not isinstance(model, Link):
            return None
        comfy_type, inputs = nodes[model.node]
        if comfy_type == SHIFT:
            return inputs
        model = inputs.get("model")
    return None


def _create_video(out: Rewrite, nodes: Nodes, node: Any, readers: dict[str, list[str]],
                  samplers: set[str], nid: str, inputs: dict[str, Any]) -> None:
    """CreateVideo of a MiniMax-H3 clip's decoded frames (and sound) → minimaxh3/decode."""
    frames = node(inputs.get("images"))
    if frames is None or frames[1] not in _FRAME_DECODES:
        return
    sampled = frames[2].get("samples")
    if not isinstance(sampled, Link) or sampled.node not in samplers:
        return
    out.rules[nid] = DECODE_RULE
    out.inputs[nid] = {"vae": frames[2].get("vae"), "samples": sampled}
    decodes = [frames]
    audio = node(inputs.get("audio"))
    if audio is not None and audio[1] == "VAEDecodeAudio":
        decodes.append(audio)
    elif audio is None:
        out.warnings.append((nid, "CreateVideo", "no audio is wired: minimaxh3/decode keeps the "
                             "clip's own sound"))
    for decode in decodes:
        if all(nodes[r][0] == "CreateVideo" for r in readers.get(decode[0], [])):
            out.folded.setdefault(decode[0], f"decoded with the clip by minimaxh3/decode {nid}")
    fps = inputs.get("fps")
    if isinstance(fps, int | float) and float(fps) != FPS:
        out.warnings.append((nid, "CreateVideo", f"fps {fps:g} is not the clip's {FPS:g} "
                             "(MiniMax-H3 makes 24 fps clips): the clip keeps its own"))


def _loaders(out: Rewrite, nodes: Nodes, readers: dict[str, list[str]]) -> None:
    """ComfyUI's four loaders → minimaxh3/load-files, when the workflow has one UNETLoader, one
    VAELoader read by VAEDecodeAudio (the audio VAE), one other (the video VAE) and one
    CLIPLoader of type minimax; the audio VAE's loader folds (minimaxh3/decode decodes the sound
    with the parts' own audio VAE)."""
    def of(comfy_type: str) -> list[str]:
        return [nid for nid, (t, _) in nodes.items() if t == comfy_type]

    vaes = of("VAELoader")
    audio = [v for v in vaes if any(nodes[r][0] == "VAEDecodeAudio" for r in readers.get(v, []))]
    clips = [c for c in of("CLIPLoader") if nodes[c][1].get("type") == CLIP_TYPE]
    unets, video = of("UNETLoader"), [v for v in vaes if v not in audio]
    if not all(len(found) == 1 for found in (unets, audio, video, clips)):
        return
    names = {"unet_name": nodes[unets[0]][1].get("unet_name"),
             "vae_name": nodes[video[0]][1].get("vae_name"),
             "audio_vae_name": nodes[audio[0]][1].get("vae_name"),
             "clip_name": nodes[clips[0]][1].get("clip_name")}
    if not all(isinstance(name, str) for name in names.values()):
        return
    for nid in (unets[0], video[0], audio[0], clips[0]):
        out.rules[nid], out.inputs[nid] = FILES_RULES[nodes[nid][0]], dict(names)
    if all(r in out.folded for r in readers.get(audio[0], [])):
        out.folded[audio[0]] = ("the audio VAE decodes the sound in minimaxh3/decode (its "
                                "minimaxh3/load-files parts)")
