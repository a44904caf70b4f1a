"""The nodes of the LTX-2 family (workers/models/ltx2/nodes.py runs them): a clip's audio + video
latent, first-frame conditioning and keyframe guides, LTX2Pipeline's sampler and the decode
into a `Video` (frames, fps and the vocoder's sound; `video/save` keeps it as MP4 H.264 + AAC)."""

from __future__ import annotations

from apps.graphs.descriptors import NodeDescriptor, Param, Port
from apps.graphs.nodes_image import MAX_SIDE
from apps.graphs.nodes_video import MAX_FPS

MAX_FRAMES = 1025  # frames of one clip (8k + 1; LTX-2 renders 121 at 25 fps)
MAX_STEPS = 100
_sizes = (*(Port(name, "int", required=False) for name in ("width", "height", "length")),
          Port("fps", "float", required=False, accepts=("int",)))


def _g(name: str, default: float, text: str) -> Param:
    return Param(name, "float", default, min=0.0, max=30.0, description=text)


LTX2 = (
    NodeDescriptor(
        "ltx2/empty-latent", "LTX-2 empty latent", "latent",
        inputs=_sizes,
        outputs=(Port("latent", "latent"),),
        params=(
            Param("width", "int", 768, min=32, max=MAX_SIDE, multiple_of=32, input="width",
                  description="Frame width in pixels (a multiple of 32)."),
            Param("height", "int", 512, min=32, max=MAX_SIDE, multiple_of=32, input="height",
                  description="Frame height in pixels (a multiple of 32)."),
            Param("length", "int", 121, min=1, max=MAX_FRAMES, input="length",
                  description="Frames of the clip: 8k + 1 (the VAE packs 8 frames per latent "
                  "frame after the first); another length keeps the 8k + 1 below it, as "
                  "ComfyUI's EmptyLTXVLatentVideo does."),
            Param("fps", "float", 24.0, min=1.0, max=MAX_FPS, input="fps",
                  description="Frames per second: the clip's and its sound's length."),
        ),
        description="An empty LTX-2 clip, video and audio (ComfyUI's EmptyLTXVLatentVideo + "
        "LTXVEmptyLatentAudio joined by LTXVConcatAVLatent): ltx2/sample draws its noise at "
        "the model's latent sizes.",
    ),
    NodeDescriptor(
        "ltx2/image-to-video", "LTX-2 image to video", "latent",
        inputs=(Port("vae", "vae"), Port("image", "image"), Port("latent", "latent")),
        outputs=(Port("latent", "latent"),),
        params=(Param("crf", "int", -1, min=-1, max=51,
                      description="H.264 CRF the image is re-compressed at before encoding, as "
                      "LTX-2 was trained (−1: the model's default, 33; 0: as it is)."),
                Param("strength", "float", 1.0, min=0.0, max=1.0,
                      description="How firmly the first frame keeps the image (ComfyUI's "
                      "LTXVImgToVideoInplace strength): 1 holds it (LTX2ImageToVideoPipeline); "
                      "below, the frame denoises too, pulled toward the image by it; 0: the "
                      "image is ignored.")),
        description="The clip's first frame conditioned on an image (ComfyUI's "
        "LTXVImgToVideoInplace, LTX2ImageToVideoPipeline's encode): the image is resized to "
        "the clip's size and its latents stay fixed (at strength 1) while the rest denoises. "
        "An empty clip "
        "latent, or a sampled one (the two-stage workflows' upsampled clip, refined next).",
    ),
    NodeDescriptor(
        "ltx2/add-guide", "LTX-2 add guide", "latent",
        inputs=(Port("positive", "conditioning"),
                Port("negative", "conditioning", required=False), Port("vae", "vae"),
                Port("latent", "latent"), Port("image", "image")),
        outputs=(Port("positive", "conditioning"), Port("negative", "conditioning"),
                 Port("latent", "latent")),
        params=(Param("frame_idx", "int", 0, min=-MAX_FRAMES, max=MAX_FRAMES - 1,
                      description="The clip's frame the image guides (ComfyUI's frame_idx): "
                      "0 the first, negative counted from the end (−1: the last)."),
                Param("strength", "float", 1.0, min=0.0, max=1.0,
                      description="How firmly the frame keeps the image: 1 holds it; below, "
                      "its tokens denoise too, from (1 − strength)·σ, pulled toward it."),
                Param("crf", "int", -1, min=-1, max=51,
                      description="H.264 CRF the image is re-compressed at before encoding, as "
                      "LTX-2 was trained (ComfyUI's LTXVPreprocess img_compression; −1: the "
                      "model's default; 0: as it is).")),
        description="A keyframe guide: the clip keeps an image at a frame (ComfyUI's "
        "LTXVAddGuide, LTX2ConditionPipeline's conditions; chain one per frame: first and last "
        "frame to video). The image is cut to the clip's aspect at its centre and scaled to "
        "its size (as ComfyUI does); at frame 0 it replaces the clip's first frame (and an "
        "ltx2/image-to-video image), elsewhere its tokens join the clip's at that frame's "
        "time, and ltx2/sample crops them off again (ComfyUI's LTXVCropGuides). The prompts "
        "pass on unchanged. As LTX2ConditionPipeline, not ComfyUI: below strength 1 the "
        "transformer sees the guide's own noisy tokens (ComfyUI: the clean image), and frame 0 "
        "is conditioned in place (ComfyUI now appends it too). A guide's time is its frame "
        "(ComfyUI's): the pipeline's latent index k is frame 8(k − 1) + 1.",
    ),
    NodeDescriptor(
        "ltx2/sample", "LTX-2 sample", "sampling",
        inputs=(Port("model", "model"), Port("positive", "conditioning"),
                Port("negative", "conditioning", required=False), Port("latent", "latent"),
                Port("seed", "int", required=False), Port("sigmas", "sigmas", required=False)),
        outputs=(Port("latent", "latent"),),
        params=(
            Param("seed", "int", 0, min=0, max=2**53 - 1, input="seed",
                  description="Noise seed (video then audio noise, as LTX2Pipeline draws it)."),
            Param("steps", "int", 40, min=1, max=MAX_STEPS,
                  description="Denoising steps (wired sigmas set their own: one per interval)."),
            _g("cfg", 3.0, "Video classifier-free guidance (≤ 1 with audio_cfg ≤ 1: off)."),
            _g("stg", 1.0, "Video spatio-temporal guidance (0: off)."),
            _g("modality", 3.0, "Video modality-isolation guidance (≤ 1: off)."),
            Param("rescale", "float", 0.7, min=0.0, max=1.0, description="Video guidance rescale."),
            _g("audio_cfg", 7.0, "Audio classifier-free guidance."),
            _g("audio_stg", 1.0, "Audio spatio-temporal guidance."),
            _g("audio_modality", 3.0, "Audio modality-isolation guidance."),
            Param("audio_rescale", "float", 0.7, min=0.0, max=1.0,
                  description="Audio guidance rescale."),
            Param("stg_blocks", "string", "28", max_length=200,
                  description="Transformer blocks STG perturbs, comma-separated (LTX-2: 28)."),
        ),
        description="LTX2Pipeline's denoise of a clip's video and sound (flow Euler over its "
        "resolution-shifted sigmas, or the wired ones as they are: ComfyUI's ManualSigmas, "
        "LTX2Pipeline's `sigmas`; CFG + STG + modality guidance); runs of one clip size "
        "share every transformer call. The negative prompt defaults to the empty one. A "
        "sampled clip latent (an upsampled one) is refined over wired sigmas: noise mixed in "
        "at their first level (LTX2ImageToVideoPipeline's noise_scale), video and sound.",
    ),
    NodeDescriptor(
        "ltx2/load-files", "LTX-2 load files", "loaders",
        outputs=(Port("model", "model"), Port("encoder", "text-encoder"), Port("vae", "vae")),
        params=(Param("diffusion_model", "model", required=True, options_from="diffusion_models",
                      family="ltx2", description="The audio-video transformer."),
                Param("vae", "model", required=True, options_from="vae", family="ltx2",
                      description="The video VAE."),
                Param("audio_vae", "model", required=True, options_from="vae", family="ltx2",
                      description="The audio VAE with its vocoder."),
                Param("text_encoder", "model", required=True, options_from="text_encoders",
                      family="ltx2", description="The Gemma with the connectors' projection.")),
        description="LTX-2 from ComfyUI's separate files (the LTX-2.5 templates' UNETLoader, "
        "VAELoaders and CLIPLoader type ltxv), each with its <stem>.diffusers/ configs beside "
        "it: the same model, text encoder and VAE as load/checkpoint gives.",
    ),
    NodeDescriptor(
        "load/latent-upscale-model", "Load latent upscale model", "loaders",
        outputs=(Port("latent_upscale_model", "latent-upscale-model"),),
        params=(Param("file", "model", required=True, options_from="latent_upscale_models",
                      family="ltx2"),),
        description="An LTX-2 latent upsampler from the models dir's latent_upscale_models/ "
        "(ComfyUI's LatentUpscaleModelLoader; Lightricks' spatial ×2 file).",
    ),
    NodeDescriptor(
        "ltx2/upsample-latent", "LTX-2 upsample latent", "latent",
        inputs=(Port("latent", "latent"), Port("latent_upscale_model", "latent-upscale-model"),
                Port("vae", "vae")),
        outputs=(Port("latent", "latent"),),
        description="A sampled clip's video latents at twice the width and height, its sound "
        "kept (ComfyUI's LTXVLatentUpsampler, LTX2LatentUpsamplePipeline): the VAE's "
        "statistics undone, the upsampler, the statistics redone.",
    ),
    NodeDescriptor(
        "ltx2/decode", "LTX-2 decode", "latent",
        inputs=(Port("vae", "vae"), Port("latent", "latent")),
        outputs=(Port("video", "video"),),
        description="A sampled LTX-2 latent as a clip: frames (video VAE) at its fps with the "
        "sound of the audio VAE + vocoder (ComfyUI's VAEDecode + VAEDecodeAudio + CreateVideo).",
    ),
)
