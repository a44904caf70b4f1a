"""The nodes of the MiniMax-H3 family (workers/models/minimaxh3/nodes.py runs them): a clip's
request (prompt, size, length, first / last frame), MiniMaxH3ModularPipeline's sampler and the
decode into a `Video` (frames at 24 fps with the stereo sound; `video/save` keeps it as MP4)."""

from __future__ import annotations

from apps.graphs.descriptors import NodeDescriptor, Param, Port
from apps.graphs.nodes_image import MAX_SIDE

MAX_PROMPT = 32000  # characters of one prompt (apps/graphs/nodes.py's)
MAX_FRAMES = 362  # 15 s at 24 fps, MiniMax-H3's longest clip (17n + 5)
MAX_STEPS = 100
MAX_REFERENCES = 9  # image references of one reference-to-video clip
SIZE_PARAMS = (
    Param("width", "int", 1344, min=32, max=MAX_SIDE, multiple_of=32, input="width",
          description="Frame width in pixels (a multiple of 32)."),
    Param("height", "int", 768, min=32, max=MAX_SIDE, multiple_of=32, input="height",
          description="Frame height in pixels (a multiple of 32)."),
    Param("length", "int", 124, min=5, max=MAX_FRAMES, input="length",
          description="Frames at 24 fps, rounded up to 17n + 5; 5 to 15 seconds "
          "(120 to 360 frames)."),
)

MINIMAXH3 = (
    NodeDescriptor(
        "minimaxh3/image-to-video", "MiniMax-H3 image to video", "latent",
        inputs=(Port("encoder", "text-encoder"), Port("vae", "vae"),
                Port("prompt", "text", required=False),
                Port("first_frame", "image", required=False),
                Port("last_frame", "image", required=False),
                *(Port(name, "int", required=False) for name in ("width", "height", "length"))),
        outputs=(Port("positive", "conditioning"), Port("latent", "latent")),
        params=(
            Param("prompt", "string", "", input="prompt", max_length=MAX_PROMPT,
                  description="What the clip shows and sounds like."),
            *SIZE_PARAMS,
        ),
        description="A MiniMax-H3 clip's conditioning and empty latent (ComfyUI's "
        "MiniMaxH3ImageToVideo): the prompt encoded by the Qwen3-VL, with a `<Picture i>:` "
        "label and vision block per keyframe; a first and/or last frame fitted to the canvas "
        "and VAE-encoded as the clip's held ends (MiniMaxH3ModularPipeline's fl2va; none: "
        "t2va).",
    ),
    NodeDescriptor(
        "minimaxh3/reference-to-video", "MiniMax-H3 reference to video", "latent",
        inputs=(Port("encoder", "text-encoder"), Port("vae", "vae"),
                Port("prompt", "text", required=False),
                *(Port(f"image{i}", "image", required=False)
                  for i in range(1, MAX_REFERENCES + 1)),
                *(Port(name, "int", required=False) for name in ("width", "height", "length"))),
        outputs=(Port("positive", "conditioning"), Port("latent", "latent")),
        params=(
            Param("prompt", "string", "", input="prompt", max_length=MAX_PROMPT,
                  description="What the clip shows and sounds like; `<Picture i>` names the "
                  "i-th wired image."),
            *SIZE_PARAMS,
            Param("mode", "enum", "match", choices=("match", "max"),
                  description="A reference's size, its aspect kept and never scaled up: the "
                  "clip's pixel area (match) or a 2048-pixel short edge (max: closer "
                  "likeness, slower steps)."),
        ),
        description="A MiniMax-H3 reference-to-video clip's conditioning and empty latent "
        "(ComfyUI's MiniMaxH3ReferenceToVideo with image references; MiniMaxH3ModularPipeline's "
        "ref2va): 1 to 9 images, each with a `<Picture i>:` label and vision block before the "
        "prompt and VAE-encoded at its own size as a held block of the sequence. Sample it "
        "with the ref2va transformer (transformer_ref).",
    ),
    NodeDescriptor(
        "minimaxh3/sample", "MiniMax-H3 sample", "sampling",
        inputs=(Port("model", "model"), Port("positive", "conditioning"),
                Port("latent", "latent"), Port("seed", "int", required=False),
                Port("steps", "int", required=False),
                Port("shift_video", "float", required=False, accepts=("int",)),
                Port("shift_audio", "float", required=False, accepts=("int",))),
        outputs=(Port("latent", "latent"),),
        params=(
            Param("seed", "int", 0, min=0, max=2**53 - 1, input="seed",
                  description="Noise seed (keyframe, video then audio noise, as the pipeline "
                  "draws it)."),
            Param("steps", "int", 39, min=1, max=MAX_STEPS, input="steps",
                  description="Denoising steps: transformer calls (the pipeline's "
                  "num_inference_steps counts one more, its sigma grid's points)."),
            Param("shift_video", "float", 12.0, min=0.01, max=100.0, input="shift_video",
                  description="The video schedule's shift (ComfyUI's MiniMaxH3SigmaShift)."),
            Param("shift_audio", "float", 3.0, min=0.01, max=100.0, input="shift_audio",
                  description="The sound schedule's shift."),
        ),
        description="MiniMaxH3ModularPipeline's denoise of a clip's video and sound: one "
        "guidance-distilled transformer call per step over the packed text, keyframe, audio "
        "and video rows, Euler on two schedules (shifts 12 and 3 unless set), on the "
        "model's step batcher.",
    ),
    NodeDescriptor(
        "minimaxh3/load-files", "MiniMax-H3 load files", "loaders",
        outputs=(Port("model", "model"), Port("encoder", "text-encoder"), Port("vae", "vae")),
        params=(Param("diffusion_model", "model", required=True, options_from="diffusion_models",
                      family="minimaxh3",
                      description="The transformer (ComfyUI's single file or its folder)."),
                Param("vae", "model", required=True, options_from="vae", family="minimaxh3",
                      description="The video VAE (a diffusers folder)."),
                Param("audio_vae", "model", required=True, options_from="vae",
                      family="minimaxh3", description="The audio VAE (a diffusers folder)."),
                Param("text_encoder", "model", required=True, options_from="text_encoders",
                      family="minimaxh3", description="The Qwen3-VL with its tokenizer and "
                      "processor (a diffusers folder).")),
        description="MiniMax-H3 from ComfyUI's four loaders' parts (its templates' UNETLoader, "
        "VAELoaders and CLIPLoader type minimax): the same model, text encoder and VAE as "
        "load/checkpoint gives. Quantized files are refused by name.",
    ),
    NodeDescriptor(
        "minimaxh3/decode", "MiniMax-H3 decode", "latent",
        inputs=(Port("vae", "vae"), Port("latent", "latent")),
        outputs=(Port("video", "video"),),
        description="A sampled MiniMax-H3 latent as a clip: frames (video VAE) at 24 fps with "
        "the audio VAE's stereo sound (ComfyUI's VAEDecode + VAEDecodeAudio + CreateVideo).",
    ),
)
