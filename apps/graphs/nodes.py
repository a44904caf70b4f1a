"""The farm's node vocabulary: every node type a graph may use, declared once."""

from __future__ import annotations

from dataclasses import replace

from apps.graphs.descriptors import NodeDescriptor, Param, Port
from apps.graphs.nodes_audio import AUDIO
from apps.graphs.nodes_image import IMAGE_OPS, MAX_SIDE, UPSCALING
from apps.graphs.nodes_logic import SWITCHES, VALUES
from apps.graphs.nodes_ltx2 import LTX2
from apps.graphs.nodes_minimaxh3 import MINIMAXH3
from apps.graphs.nodes_qwen import QWEN
from apps.graphs.nodes_textgen import TEXTGEN
from apps.graphs.nodes_video import VIDEO
from apps.graphs.nodes_wan import WAN
from workers.models.families import REGISTERED

MAX_SEED = 2**53 - 1  # the largest integer a JSON client (JavaScript) holds exactly
SAVE_FORMATS = {"png": "image/png", "webp": "image/webp", "jpeg": "image/jpeg"}
# characters of a prompt or any text fed to the text encoder (system prompts included: the
# shipped templates' run to 28,000)
MAX_PROMPT = 32000
MAX_LABEL = 200  # characters of a take's label (copied into every take and run listing)

_width = Param("width", "int", 1024, min=16, max=MAX_SIDE, multiple_of=16,
               description="Image width in pixels (a multiple of 16).")
_height = Param("height", "int", 1024, min=16, max=MAX_SIDE, multiple_of=16,
                description="Image height in pixels (a multiple of 16).")


def _wired(param: Param) -> Param:
    """`param`, suppliable by the input port of its name (an upstream int: ComfyUI's widget
    input); a value that arrives is checked against the param's limits when the node runs."""
    return replace(param, input=param.name)


_seed = Param("seed", "int", 0, min=0, max=MAX_SEED, input="seed",
              description="Noise seed; the same seed gives the same image.")
MAX_STEPS = 100
MAX_END_STEP = 10000  # ComfyUI's KSamplerAdvanced end_step default: past any schedule
_steps = Param("steps", "int", 8, min=1, max=MAX_STEPS, description="Denoising steps.")
_guidance = Param("guidance", "float", 0.0, min=0.0, max=100.0,  # ComfyUI's cfg / FluxGuidance
                  description="Classifier-free guidance scale; 0 disables CFG (Turbo default). "
                  "A guidance-distilled model's embedded scale (FLUX.1 Fill's is 30).")
_vae_tile = Param("tile_size", "int", 512, min=32, max=4096,
                  description="Image pixels per tile side: smaller tiles need less memory.")
_vae_overlap = Param("overlap", "int", 64, min=0, max=4096,
                     description="Context pixels each tile sees beyond its own part (at least "
                     "the tiled layers' reach, 7 pixels, whatever is set).")
PARALLEL_CHOICES = ("auto", "off", "2", "4", "8")
# The generic samplers and schedulers (workers/sampling/samplers.py, schedulers.py: ComfyUI's
# names); "default" is the family's own (its diffusers pipeline's scheduler).
SAMPLERS = ("euler", "euler_ancestral", "heun", "dpmpp_2m", "dpmpp_2m_sde", "dpmpp_sde",
            "res_multistep", "uni_pc", "lcm")
SCHEDULERS = ("simple", "normal", "karras", "exponential", "sgm_uniform", "beta")
MAX_SIGMAS = 2000  # characters of a ManualSigmas list
_parallel = Param("parallel", "enum", "auto", choices=PARALLEL_CHOICES,
                  description="Split one image's denoise over a multi-GPU worker group: a group "
                  "size (\"2\": the xfuser.2 queue), \"off\" (one GPU), or \"auto\" (a group "
                  "only when no single live GPU can hold the run).")

SOURCES = (
    NodeDescriptor(
        "input/text", "Text", "input",
        outputs=(Port("text", "text"),),
        params=(Param("value", "string", "", max_length=MAX_PROMPT, description="The text."),),
    ),
    NodeDescriptor(
        "input/int", "Integer", "input",
        outputs=(Port("value", "int"),),
        params=(Param("value", "int", 0, min=-MAX_SEED, max=MAX_SEED),),
    ),
    NodeDescriptor(
        "input/float", "Number", "input",
        outputs=(Port("value", "float"),),
        params=(Param("value", "float", 0.0),),
    ),
    NodeDescriptor(
        "input/image", "Input image", "input",
        outputs=(Port("image", "image"),),
        params=(Param("asset", "asset", required=True, description="An uploaded asset id."),),
    ),
)

IMAGE = (
    NodeDescriptor(
        "image/load", "Load image", "image",
        outputs=(Port("image", "image"), Port("mask", "mask")),
        params=(Param("asset", "asset", required=True, description="An uploaded asset id."),),
        description="An uploaded image, and its mask as ComfyUI's LoadImage gives it: 1 − alpha "
        "(an image without alpha: a 64×64 mask of zeros).",
    ),
    NodeDescriptor(
        "image/crop", "Crop image", "image",
        inputs=(Port("image", "image"), *(Port(side, "int", required=False)
                                          for side in ("x", "y", "width", "height"))),
        outputs=(Port("image", "image"),),
        params=(
            Param("x", "int", 0, min=0, max=MAX_SIDE * 2, input="x"),
            Param("y", "int", 0, min=0, max=MAX_SIDE * 2, input="y"),
            Param("width", "int", required=True, min=1, max=MAX_SIDE * 2, input="width"),
            Param("height", "int", required=True, min=1, max=MAX_SIDE * 2, input="height"),
        ),
    ),
    NodeDescriptor(
        "image/save", "Save take", "output",
        inputs=(Port("image", "image"),),
        params=(Param("label", "string", "", max_length=MAX_LABEL,
                      description="A free label kept with the take."),
                Param("format", "enum", "png", choices=tuple(SAVE_FORMATS),
                      description="The take's file format (its bytes' content type)."),
                Param("quality", "int", 90, min=1, max=100,
                      description="WebP / JPEG quality (PNG is lossless and ignores it).")),
        produces_takes=True,
        description="Keeps its input as an immutable take (PNG, WebP or JPEG).",
    ),
    NodeDescriptor(
        "util/delay", "Delay (diagnostic)", "util",
        inputs=(Port("image", "image"),),
        outputs=(Port("image", "image"),),
        params=(Param("seconds", "float", 1.0, min=0.0, max=600.0),),
        hidden=True,
        description="Passes its image through after a pause, checking cancellation; for "
        "exercising leases, cancellation and failover on a live farm.",
    ),
)

MODELS = (
    NodeDescriptor(
        "load/diffusion-model", "Load diffusion model", "loaders",
        outputs=(Port("model", "model"),),
        params=(Param("file", "model", required=True, options_from="diffusion_models"),),
    ),
    NodeDescriptor(
        "load/checkpoint", "Load checkpoint", "loaders",
        outputs=(Port("model", "model"), Port("encoder", "text-encoder"), Port("vae", "vae")),
        params=(Param("file", "model", required=True, options_from="checkpoints"),),
        description="An all-in-one file (SDXL's): the diffusion model, its text encoders and "
        "its VAE, loaded by the family that recognises the file.",
    ),
    NodeDescriptor(
        "load/lora", "Load LoRA", "loaders",
        inputs=(Port("model", "model"), Port("encoder", "text-encoder", required=False)),
        outputs=(Port("model", "model"), Port("encoder", "text-encoder", passes="encoder")),
        params=(Param("lora", "model", required=True, options_from="loras"),
                Param("strength", "float", 1.0, min=-20.0, max=20.0,
                      description="The LoRA's weight on the model (ComfyUI's strength_model)."),
                Param("strength_clip", "float", 1.0, min=-20.0, max=20.0,
                      description="The LoRA's weight on the wired text encoder (ComfyUI's "
                      "strength_clip; 0: the text encoder passes unchanged).")),
        description="The model with one more LoRA (chain them to stack LoRAs) and, when a text "
        "encoder is wired, that encoder with the LoRA's text-encoder half (CLIP for SDXL and "
        "FLUX.1). The base weights are shared: runs with other LoRAs, or none, share its "
        "forwards and encodes.",
    ),
    NodeDescriptor(
        "load/vae", "Load VAE", "loaders",
        outputs=(Port("vae", "vae"),),
        params=(Param("file", "model", required=True, options_from="vae"),),
    ),
    NodeDescriptor(
        "load/text-encoder", "Load text encoder", "loaders",
        outputs=(Port("encoder", "text-encoder"),),
        params=(Param("file", "model", required=True, options_from="text_encoders"),
                Param("file_2", "model", options_from="text_encoders",
                      description="A family's second text encoder (FLUX.1: CLIP-L and T5, "
                      "in either order)."),
                Param("family", "enum", "auto", choices=("auto", *REGISTERED),
                      description="The family whose encoder this is, where several read the "
                      "same file (a Qwen3: Z-Image or FLUX.2 Klein; ComfyUI's CLIPLoader "
                      "type); auto: the first that recognises it.")),
    ),
    NodeDescriptor(
        "encode/text", "Encode text", "conditioning",
        inputs=(Port("encoder", "text-encoder"), Port("text", "text", required=False)),
        outputs=(Port("conditioning", "conditioning"),),
        params=(Param("text", "string", "", input="text", max_length=MAX_PROMPT),),
    ),
    NodeDescriptor(
        "latent/empty", "Empty latent", "latent",
        inputs=(Port("width", "int", required=False), Port("height", "int", required=False)),
        outputs=(Port("latent", "latent"),),
        params=(_wired(_width), _wired(_height)),
    ),
    NodeDescriptor(
        "sample", "Sample", "sampling",
        inputs=(
            Port("model", "model"),
            Port("positive", "conditioning"),
            Port("negative", "conditioning", required=False),
            Port("latent", "latent"),
            Port("seed", "int", required=False),
        ),
        outputs=(Port("latent", "latent"),),
        params=(
            _seed, _steps, _guidance,
            Param("denoise", "float", 1.0, min=0.0, max=1.0,
                  description="1.0 starts from noise; less keeps part of the input latent."),
            Param("shift", "float", None, min=0.01, max=100.0,
                  description="The sigma shift α of a flow-matching family: σ = α·t / (1 + "
                  "(α − 1)·t) (ComfyUI's ModelSamplingSD3 / AuraFlow shift; ModelSamplingFlux's "
                  "is e^shift). Unset: the family's default (Z-Image 3, FLUX.1 by resolution)."),
            _parallel,
            Param("sampler", "enum", "default", choices=("default", *SAMPLERS),
                  description="A ComfyUI sampler, or the family's own (\"default\"; euler "
                  "when a named scheduler is chosen)."),
            Param("scheduler", "enum", "default", choices=("default", *SCHEDULERS),
                  description="A ComfyUI scheduler over the model's sigmas, or the family's "
                  "own schedule (\"default\")."),
        ),
    ),
    NodeDescriptor(
        "vae/decode", "VAE decode", "latent",
        inputs=(Port("vae", "vae"), Port("latent", "latent")),
        outputs=(Port("image", "image"),),
    ),
    NodeDescriptor(
        "vae/encode", "VAE encode", "latent",
        inputs=(Port("vae", "vae"), Port("image", "image")),
        outputs=(Port("latent", "latent"),),
    ),
    NodeDescriptor(
        "vae/decode-tiled", "VAE decode (tiled)", "latent",
        inputs=(Port("vae", "vae"), Port("latent", "latent")),
        outputs=(Port("image", "image"),),
        params=(_vae_tile, _vae_overlap),
        description="vae/decode in tiles (less memory at large sizes), the same image within "
        "float rounding: whole-image normalisation statistics (workers/models/tiled_vae.py).",
    ),
    NodeDescriptor(
        "vae/encode-tiled", "VAE encode (tiled)", "latent",
        inputs=(Port("vae", "vae"), Port("image", "image")),
        outputs=(Port("latent", "latent"),),
        params=(_vae_tile, _vae_overlap),
        description="vae/encode in tiles, the same latent within float rounding.",
    ),
    NodeDescriptor(
        "zimage/turbo", "Z-Image Turbo", "generate",
        inputs=(
            Port("image", "image", required=False),
            Port("prompt", "text", required=False),
            Port("seed", "int", required=False),
        ),
        outputs=(Port("image", "image"),),
        params=(
            Param("prompt", "string", "", input="prompt", max_length=MAX_PROMPT),
            Param("negative_prompt", "string", "", max_length=MAX_PROMPT),
            _width, _height,
            Param("steps", "int", 8, min=1, max=100),
            _guidance, _seed,
            Param("strength", "float", 0.6, min=0.0, max=1.0,
                  description="img2img only: how much of the init image is re-noised."),
            Param("model", "model", required=True, options_from="diffusion_models",
                  family="zimage"),
            Param("vae", "model", required=True, options_from="vae", family="zimage"),
            Param("text_encoder", "model", required=True, options_from="text_encoders",
                  family="zimage"),
            _parallel,
        ),
        description="Text-to-image (or img2img with an input image) with Z-Image Turbo.",
    ),
    NodeDescriptor(
        "flux2/reference", "FLUX.2 reference images", "conditioning",
        inputs=(
            Port("conditioning", "conditioning"),
            Port("vae", "vae"),
            Port("image", "image"),
            Port("image_2", "image", required=False),
            Port("image_3", "image", required=False),
        ),
        outputs=(Port("conditioning", "conditioning"),),
        description="FLUX.2 image editing: the prompt conditioned on 1–3 reference images "
        "(uploaded or upstream), each scaled to at most 1 MP and cropped to multiples of 16 "
        "as the pipelines do, then VAE-encoded as reference latents (ComfyUI's "
        "ReferenceLatent). Chain it for more references.",
    ),
    NodeDescriptor(
        "flux1/inpaint", "FLUX.1 inpaint conditioning", "conditioning",
        inputs=(Port("positive", "conditioning"), Port("negative", "conditioning", required=False),
                Port("vae", "vae"), Port("image", "image"), Port("mask", "mask")),
        outputs=(Port("positive", "conditioning"), Port("negative", "conditioning",
                                                          passes="negative"),
                 Port("latent", "latent")),
        params=(Param("noise_mask", "bool", True,
                      description="Keep the unmasked part of the image while sampling (the "
                      "latent's noise mask); off: the sampler repaints all of it."),),
        description="Inpainting with FLUX.1 Fill (ComfyUI's InpaintModelConditioning): the "
        "prompts conditioned on the image with the masked part grey and on the mask (the Fill "
        "transformer's extra input, as FluxFillPipeline builds it), and the image's latent to "
        "sample. The mask (1: repaint) is resized to the image; an image whose sides are not "
        "multiples of 16 is cut to its centre that is (the take is that size).",
    ),
    NodeDescriptor(
        "model/differential-diffusion", "Differential diffusion", "sampling",
        inputs=(Port("model", "model"),),
        outputs=(Port("model", "model"),),
        params=(Param("strength", "float", 1.0, min=0.0, max=1.0,
                      description="1: the thresholded mask; below, blended with the mask "
                      "itself (ComfyUI's rule: 0 counts as 1)."),),
        description="The model with ComfyUI's DifferentialDiffusion: a noise mask's grey levels "
        "set how long each pixel is repainted (a pixel of grey g joins the denoising once the "
        "run's progress passes 1 − g), for soft inpainting edges.",
    ),
    NodeDescriptor(
        "flux2/scheduler", "FLUX.2 scheduler", "sampling",
        inputs=(Port("steps", "int", required=False), Port("width", "int", required=False),
                Port("height", "int", required=False)),
        outputs=(Port("sigmas", "sigmas"),),
        params=(Param("steps", "int", 20, min=1, max=MAX_STEPS, input="steps"),
                Param("width", "int", 1024, min=16, max=MAX_SIDE, input="width"),
                Param("height", "int", 1024, min=16, max=MAX_SIDE, input="height")),
        description="FLUX.2's sigmas for `steps` at width×height (ComfyUI's Flux2Scheduler: "
        "the shift from the image's 16-px tokens and the steps; the pipelines' schedule).",
    ),
    NodeDescriptor(
        "flux2/reference-latent", "FLUX.2 reference latent", "conditioning",
        inputs=(Port("conditioning", "conditioning"), Port("latent", "latent")),
        outputs=(Port("conditioning", "conditioning"),),
        description="FLUX.2 image editing from an encoded reference (ComfyUI's ReferenceLatent "
        "after a VAE encode): the prompt conditioned on the latent as is.",
    ),
    NodeDescriptor(
        "flux1/reference", "FLUX.1 Kontext reference image", "conditioning",
        inputs=(Port("conditioning", "conditioning"), Port("vae", "vae"), Port("image", "image")),
        outputs=(Port("conditioning", "conditioning"),),
        description="FLUX.1 Kontext image editing: the prompt conditioned on a reference image "
        "(uploaded or upstream), scaled to the Kontext resolution nearest its aspect as "
        "FluxKontextPipeline does, then VAE-encoded as a reference latent. Chain it for more "
        "references.",
    ),
    NodeDescriptor(
        "flux1/reference-latent", "FLUX.1 Kontext reference latent", "conditioning",
        inputs=(Port("conditioning", "conditioning"), Port("latent", "latent")),
        outputs=(Port("conditioning", "conditioning"),),
        description="FLUX.1 Kontext image editing from an encoded reference (ComfyUI's "
        "ReferenceLatent after a VAE encode): the prompt conditioned on the latent as is; "
        "several sit side by side (ComfyUI's offset method).",
    ),
    NodeDescriptor(
        "qwenimage/edit", "Qwen-Image-Edit prompt", "conditioning",
        inputs=(
            Port("encoder", "text-encoder"),
            Port("vae", "vae", required=False),
            Port("image", "image"),
            Port("image_2", "image", required=False),
            Port("image_3", "image", required=False),
            Port("text", "text", required=False),
        ),
        outputs=(Port("conditioning", "conditioning"),),
        params=(
            Param("text", "string", "", input="text", max_length=MAX_PROMPT),
            Param("variant", "enum", "plus", choices=("plus", "edit"),
                  description="plus: Qwen-Image-Edit-2509 / 2511 (1–3 images, each shown to "
                  "the Qwen2.5-VL at ~384² px); edit: Qwen-Image-Edit (one image, at ~1 MP)."),
            Param("megapixels", "float", 1.0, min=0.001, max=4.0,
                  description="The reference latents' size (the pipelines' 1 MP)."),
        ),
        description="Qwen-Image-Edit (ComfyUI's TextEncodeQwenImageEdit / …Plus): the prompt "
        "encoded by the Qwen2.5-VL with 1–3 reference images as the diffusers edit pipelines do "
        "it, and, with a VAE wired, the images as reference latents for the transformer.",
    ),
)

_WINDOW = (
    Param("start_step", "int", 0, min=0, max=MAX_END_STEP,
          description="Run the schedule from this step (ComfyUI's KSamplerAdvanced): "
          "chain two samplers, e.g. Wan 2.2's high-noise then low-noise expert."),
    Param("end_step", "int", MAX_END_STEP, min=0, max=MAX_END_STEP,
          description="Stop before this step (past the last: run to the end)."),
    Param("add_noise", "bool", True,
          description="Noise the latent to the first step's sigma; off for a latent "
          "that a sampler returned with leftover noise."),
    Param("return_with_leftover_noise", "bool", False,
          description="A run that stops early returns its latent still noised (for "
          "the next sampler); off: its last step denoises fully."),
)


def _advanced(sample: NodeDescriptor) -> NodeDescriptor:
    """`sample` with ComfyUI's KSamplerAdvanced controls (the same runner)."""
    return replace(sample, type="sample/advanced", title="Sample (advanced)",
                   params=(*sample.params, *_WINDOW),
                   description="Sample over steps [start_step, end_step) of the schedule, "
                   "with or without fresh noise, leaving the rest of the noise or not "
                   "(ComfyUI's KSamplerAdvanced): two chain, e.g. Wan 2.2's high-noise then "
                   "low-noise expert.")


SAMPLE_ADVANCED = _advanced(next(d for d in MODELS if d.type == "sample"))

_noise_seed = Param("noise_seed", "int", 0, min=0, max=MAX_SEED, input="seed",
                    description="Noise seed; the same seed gives the same image.")
_cfg = Param("cfg", "float", 1.0, min=0.0, max=100.0,
             description="ComfyUI's CFG scale: 1 is one forward per step (no negative).")
_latent_outputs = (Port("latent", "latent"), Port("denoised", "latent"))

# Sampling as parts (ComfyUI's custom sampling): what `sample` is made of.
SAMPLING = (
    NodeDescriptor(
        "sampling/noise", "Random noise", "sampling",
        inputs=(Port("seed", "int", required=False),),
        outputs=(Port("noise", "noise"),),
        params=(_noise_seed,),
        description="Seeded start noise (ComfyUI's RandomNoise).",
    ),
    NodeDescriptor(
        "sampling/sampler", "Sampler", "sampling",
        outputs=(Port("sampler", "sampler"),),
        params=(Param("sampler_name", "enum", "euler", choices=SAMPLERS),),
        description="A sampler by name (ComfyUI's KSamplerSelect).",
    ),
    NodeDescriptor(
        "sampling/scheduler", "Scheduler", "sampling",
        inputs=(Port("model", "model"),),
        outputs=(Port("sigmas", "sigmas"),),
        params=(Param("scheduler", "enum", "simple", choices=SCHEDULERS),
                Param("steps", "int", 20, min=1, max=100),
                Param("denoise", "float", 1.0, min=0.0, max=1.0)),
        description="A named scheduler's sigmas over the model's own (ComfyUI's BasicScheduler).",
    ),
    NodeDescriptor(
        "sampling/sd-turbo-scheduler", "SD Turbo scheduler", "sampling",
        inputs=(Port("model", "model"),),
        outputs=(Port("sigmas", "sigmas"),),
        params=(Param("steps", "int", 1, min=1, max=10),
                Param("denoise", "float", 1.0, min=0.0, max=1.0)),
        description="SD-Turbo's and SDXL-Turbo's sigmas (ComfyUI's SDTurboScheduler): the "
        "model's sigmas at timesteps 999, 899, … 99, starting 10 − ⌊10·denoise⌋ in, `steps` of "
        "them; for models of discrete timesteps (SD, SDXL).",
    ),
    NodeDescriptor(
        "sampling/manual-sigmas", "Manual sigmas", "sampling",
        outputs=(Port("sigmas", "sigmas"),),
        params=(Param("sigmas", "string", "1, 0.5", max_length=MAX_SIGMAS,
                      description="Numbers separated by commas or spaces, from the first "
                      "sigma to the last."),),
        description="Sigmas written by hand (ComfyUI's ManualSigmas).",
    ),
    NodeDescriptor(
        "sampling/guider", "Basic guider", "sampling",
        inputs=(Port("model", "model"), Port("conditioning", "conditioning")),
        outputs=(Port("guider", "guider"),),
        description="The model with one conditioning, no CFG (ComfyUI's BasicGuider).",
    ),
    NodeDescriptor(
        "sampling/cfg-guider", "CFG guider", "sampling",
        inputs=(Port("model", "model"), Port("positive", "conditioning"),
                Port("negative", "conditioning", required=False)),
        outputs=(Port("guider", "guider"),),
        params=(_cfg,),
        description="Classifier-free guidance (ComfyUI's CFGGuider); an unwired negative is "
        "the empty prompt's.",
    ),
    NodeDescriptor(
        "sampling/custom-advanced", "Custom sampler (advanced)", "sampling",
        inputs=(Port("noise", "noise"), Port("guider", "guider"), Port("sampler", "sampler"),
                Port("sigmas", "sigmas"), Port("latent", "latent")),
        outputs=_latent_outputs,
        description="Denoise with the given parts (ComfyUI's SamplerCustomAdvanced); "
        "`denoised` is the last x0 estimate.",
    ),
    NodeDescriptor(
        "sampling/custom", "Custom sampler", "sampling",
        inputs=(Port("model", "model"), Port("positive", "conditioning"),
                Port("negative", "conditioning", required=False), Port("sampler", "sampler"),
                Port("sigmas", "sigmas"), Port("latent", "latent"),
                Port("seed", "int", required=False)),
        outputs=_latent_outputs,
        params=(Param("add_noise", "bool", True), _noise_seed, _cfg),
        description="Denoise with a sampler and sigmas (ComfyUI's SamplerCustom).",
    ),
)

ALL_NODES: tuple[NodeDescriptor, ...] = (SOURCES + IMAGE + IMAGE_OPS + VALUES + SWITCHES + MODELS
                                         + (SAMPLE_ADVANCED,) + SAMPLING + UPSCALING + VIDEO + AUDIO
                                         + WAN + LTX2 + MINIMAXH3 + QWEN + TEXTGEN)
