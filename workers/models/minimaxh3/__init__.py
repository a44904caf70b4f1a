"""MiniMax-H3 (video with a stereo soundtrack) through diffusers: the `minimaxh3` family. TORCH-FREE.

The package has the family's facts and file recognition here, `engine` (reproduces diffusers'
`MiniMaxH3ModularPipeline` text- and keyframes-to-video + audio bit for bit on CPU), `loading` (a
diffusers MiniMax-H3 folder, or ComfyUI's single-file transformer read by `keys`; local files
only; ComfyUI's quantized and pruned files refused by name), `plugin` (the family contract: it
loads whole from checkpoints/), `nodes` (minimaxh3/image-to-video, /reference-to-video,
/sample, /decode) and `tiny` (a random stack). It is registered last: Krea 2 and Qwen-Image 2.1
keep the Qwen3-VL files.

Files: the transformer (diffusers' keys: `audio_proj_in` + `token_refiner` + per-block
`adaln_proj`; ComfyUI's: `token_refiner.blocks.N.attn.qkv_proj` + `audio_patch_proj`), the video VAE (a
convolutional encoder with a ViT decoder: `decoder.register_tokens`), the audio VAE (`pre_block`
attention with `zero_k_bias` + a BigVGAN decoder behind `dec_in_proj`) and the Qwen3-VL text
encoder (a Qwen3-VL deep enough for its hidden state 50: Krea 2's and Qwen-Image 2.1's are not).
"""

from __future__ import annotations

from workers.models.family import FamilyInfo, LatentFormat
from workers.models.header import ModelHeader
from workers.models.lookalikes import is_qwen3_vl

# MiniMax-H3's video latents: 24 channels, ÷16 in space, (1, 2, 2) patches; 17n + 5 frames
# encode to 5n + 2 latent frames; 24 fps, 5 to 15 seconds.
LATENT = LatentFormat(channels=24, downscale=16, patch=2)
FPS = 24
TRANSFORMER = "MiniMaxH3Transformer3DModel"
VIDEO_VAE = "AutoencoderKLMiniMaxH3"
AUDIO_VAE = "AutoencoderKLMiniMaxH3Audio"
PIPELINE = "MiniMaxH3ModularPipeline"


def recognise(header: ModelHeader) -> str | None:
    """lora: a LoRA of MiniMax-H3's blocks (its `adaln_proj` modules; ComfyUI's or diffusers'
    names); checkpoint: a whole diffusers MiniMax-H3 folder (`model_index.json`); transformer:
    MiniMax-H3's packed video+audio+text transformer; vae: its video or audio VAE;
    text_encoder: a Qwen3-VL of at least TEXT_LAYER layers (its conditioner)."""
    if header.is_lora():  # MiniMax-H3's per-block AdaLN projection (no other family has one)
        return "lora" if header.has("adaln_proj.") else None
    name = header.class_name
    if name == PIPELINE:
        return "checkpoint"
    if name == TRANSFORMER or (header.has("audio_proj_in.") and header.has("token_refiner.")
                               and header.has("adaln_proj.linear.")):
        return "transformer"
    if header.has("token_refiner.blocks.", "qkv_proj.") and header.has("audio_patch_proj."):
        return "transformer"  # ComfyUI's single file (keys.py), quantized or pruned ones too
    if name in (VIDEO_VAE, AUDIO_VAE) or is_video_vae(header) or is_audio_vae(header):
        return "vae"
    if is_qwen3_vl(header) and text_layers(header) >= TEXT_LAYER:
        return "text_encoder"
    return None


TEXT_LAYER = 50  # the pipeline conditions on the Qwen3-VL's hidden state 50 (its 32B has 64)


def text_layers(header: ModelHeader) -> int:
    """A Qwen3-VL's language layers: its config's, else one more than its highest layer index
    (Krea 2's and Qwen-Image 2.1's, 4B / 8B, have 36: too shallow to be MiniMax-H3's)."""
    config = header.config.get("text_config") or header.config
    if "num_hidden_layers" in config:
        return int(config["num_hidden_layers"])
    indices = [int(part) for key in header.shapes for before, part in
               zip(key.split("."), key.split(".")[1:], strict=False)
               if before == "layers" and part.isdigit()]
    return max(indices, default=-1) + 1


def is_video_vae(header: ModelHeader) -> bool:
    """The video VAE: a 3-D convolutional encoder and a ViT decoder with register tokens."""
    return header.has("decoder.register_tokens") and header.has("encoder.down_blocks.")


def is_audio_vae(header: ModelHeader) -> bool:
    """The audio VAE: an attention `pre_block` (zero key bias) and the BigVGAN decoder's input
    projection."""
    return header.has("pre_block.attn.zero_k_bias") and header.has("dec_in_proj.")


def latent_frames(frames: int) -> int:
    """Latent frames of a clip of `frames` (17n + 5) frames."""
    return (frames - 5) // 17 * 5 + 2


def activation_gb(width: int, height: int, frames: int) -> float:
    """A rough bf16 estimate beyond the weights: the transformer's activations grow with its
    video tokens (w/32 · h/32 · latent frames), the decode with the pixels of all frames."""
    tokens = (width // LATENT.pixel_multiple) * (height // LATENT.pixel_multiple) \
        * latent_frames(frames)
    return 2.0 + 0.9 * tokens / 1000 + 0.25 * width * height * frames / 1e6


FAMILY = FamilyInfo(
    id="minimaxh3",
    title="MiniMax-H3",
    latent=LATENT,
    recognise=recognise,
    splits=False,
    activation_gb=2.0,
    # per megapixel of every frame: 0.9 GB per 1000 tokens at 5/(32·32·17) tokens per
    # pixel-frame + 0.25 for the decode
    activation_gb_per_mpx=0.9 * 1e6 * 5 / (LATENT.pixel_multiple**2 * 17) / 1000 + 0.25,
    nodes=("nodes",),
    guidance="distilled",  # guidance-distilled: one forward per step, no negative prompt
    text_encoders=("Qwen3-VL",),
    video=True,
)
