"""LTX-2 (video with an audio track) through diffusers: the `ltx2` model family. TORCH-FREE.

Registered in `families.REGISTERED` (last: its recognition never takes another family's files).
This package has the family's facts, file recognition and VRAM estimate here, `engine`
(reproduces `LTX2Pipeline` text-to-video + audio bit for bit on CPU, with its default CFG + STG +
modality guidance), `plugin` (an LTX2Pipeline folder, or ComfyUI's all-in-one file read by `keys`
with its `<stem>.diffusers/` configs (`loading`), in checkpoints/ through `load/checkpoint`;
the step batcher's predict), `nodes` (ltx2/empty-latent, ltx2/image-to-video, ltx2/add-guide,
ltx2/sample, ltx2/upsample-latent, ltx2/decode; `start`: a clip's noise and conditioning
before its first step), `upsampler` (the latent upsampler of
latent_upscale_models/) and `tiny` (a random stack as diffusers' own LTX-2 tests size it).

Files (diffusers' keys, with or without ComfyUI's `model.diffusion_model.` prefix): a whole
LTX2Pipeline folder (`model_index.json`: the checkpoint the farm loads), the audio-video
transformer (`audio_scale_shift_table` + `audio_proj_in`), the video VAE (a 5-D
`decoder.conv_in.conv` + `latents_mean`), the audio VAE (a 4-D one), the Gemma3 text encoder
(`language_model` layers with `q_norm`, a `vision_tower`), LTX-2.5's Gemma 4; ComfyUI's separate
files (workers/models/ltx2/files.py): the video VAE in the original keys, the audio VAE with
its vocoder, the Gemma "with proj" (`text_embedding_projection.`).
"""

from __future__ import annotations

import re

from workers.models.family import FamilyInfo, LatentFormat
from workers.models.header import ModelHeader
from workers.models.lookalikes import is_flux2_lora

# LTX-2's video latents: 128 channels, ÷32 in space (÷8 in time), patch 1.
LATENT = LatentFormat(channels=128, downscale=32, patch=1)
TEMPORAL = 8  # latent frames = (frames − 1) / 8 + 1
GEMMA = ("Gemma3ForConditionalGeneration", "Gemma3Model", "Gemma4UnifiedForConditionalGeneration")
# A LoRA file's Gemma 3 keys as ComfyUI names them (its generic `text_encoders.` + the state-dict
# name in its LTX-2 text encoder): `<prefix>layers.0.self_attn.q_proj.lora_A.weight`, …
GEMMA_LORA_PREFIX = "text_encoders.gemma3_12b.transformer.model."
# A latent upsampler's keys (LTX2LatentUpsamplerModel's; ComfyUI's LatentUpscaleModelLoader test)
UPSAMPLER_KEYS = ("initial_conv.weight", "post_upsample_res_blocks.0.conv2.bias")


# A LoRA key of LTX-2's audio-video blocks (ComfyUI's `diffusion_model.`, diffusers' `transformer.`
# or bare): top-level `transformer_blocks.N.` with LTX-2's attn1 / attn2 / audio_* / ff names
LORA_KEY = re.compile(r"^(?:diffusion_model\.|transformer\.)?transformer_blocks\.\d+\."
                      r"(?:attn1|attn2|audio_attn[12]|audio_to_video_attn|video_to_audio_attn|"
                      r"ff|audio_ff)\.")


def recognise(header: ModelHeader) -> str | None:
    """checkpoint: the all-in-one file Lightricks publishes and ComfyUI loads (the transformer
    in its original keys + `vae.` + `audio_vae.`, diffusers' CHECKPOINT_KEY_NAMES["ltx2"]);
    transformer: LTX-2's audio-video transformer (original or diffusers' keys); vae: its video or
    audio VAE; text_encoder: a Gemma3 with its vision tower; latent_upscaler: the two-stage
    workflows' latent upsampler (`upsampler`); lora: a LoRA of its blocks (`LORA_KEY`)."""
    if header.is_lora():  # FLUX.2's LoRAs share `transformer_blocks.N.ff.` (lookalikes.py)
        ours = any(LORA_KEY.match(k) for k in header.shapes) and not is_flux2_lora(header)
        return "lora" if ours else None
    if all(key in header.shapes for key in UPSAMPLER_KEYS):
        return "latent_upscaler"
    name = header.class_name
    original = header.has("audio_patchify_proj.") or header.has("av_ca_a2v_gate_adaln_single.")
    if name == "LTX2Pipeline":
        return "checkpoint"  # a diffusers LTX2Pipeline folder (model_index.json)
    if original and header.has("vae.per_channel_statistics.") and header.has("audio_vae."):
        return "checkpoint"  # Lightricks' / ComfyUI's all-in-one file
    if original:
        return "transformer"  # the original keys (`patchify_proj`, `adaln_single`)
    if name == "LTX2VideoTransformer3DModel" or (
        header.has("audio_scale_shift_table") and header.has("audio_proj_in.")
    ):
        return "transformer"
    if name in ("AutoencoderKLLTX2Video", "AutoencoderKLLTX2Audio") or is_ltx2_vae(header):
        return "vae"
    if header.has("audio_vae.decoder.") and header.has("vocoder."):
        return "vae"  # ComfyUI's separate audio VAE file (the all-in-one's audio_vae. + vocoder.)
    if (
        name in GEMMA
        or header.config.get("model_type") in ("gemma3", "gemma4_unified")
        or (header.has("language_model", "self_attn.q_norm.") and header.has("vision_tower."))
        or (header.has("text_embedding_projection.") and header.has("self_attn.q_norm."))
    ):
        return "text_encoder"  # the last: ComfyUI's Gemma "with proj" (the connectors' input)
    return None


def is_ltx2_vae(header: ModelHeader) -> bool:
    """An LTX-2 video VAE (5-D causal convs) or audio VAE (4-D), diffusers' keys with the
    per-channel `latents_mean` buffer, or the video VAE alone in the original keys (ComfyUI's
    separate file: `per_channel_statistics.`, `vae.` or bare)."""
    for prefix in ("", "vae."):
        shape = header.shapes.get(prefix + "decoder.conv_in.conv.weight")
        if shape is not None and len(shape) in (4, 5) and (
                "latents_mean" in header.shapes
                or prefix + "per_channel_statistics.mean-of-means" in header.shapes):
            return True
    return False


def latent_frames(frames: int) -> int:
    """Latent frames of a clip of `frames` (8k + 1) frames."""
    return (frames - 1) // TEMPORAL + 1


def activation_gb(width: int, height: int, frames: int) -> float:
    """The memory a run needs beyond its weights, counting frames: the transformer's activations
    grow with its video tokens (w/32 · h/32 · latent frames), the VAE decode with the pixels of
    all frames. Rough figures for bf16 (0.9 GB per thousand tokens under CFG's 2 rows, 0.25 GB
    per megapixel-frame for the tiled-free decode), plus a fixed 2 GB."""
    tokens = (width // LATENT.downscale) * (height // LATENT.downscale) * latent_frames(frames)
    return 2.0 + 0.9 * tokens / 1000 + 0.25 * width * height * frames / 1e6


FAMILY = FamilyInfo(
    id="ltx2",
    title="LTX-2",
    latent=LATENT,
    recognise=recognise,
    splits=False,
    activation_gb=2.0,
    # per megapixel of every frame (routing multiplies by the clip's `length`): activation_gb's
    # slope, 0.9 GB per 1000 tokens at 1/(32·32·8) tokens per pixel-frame + 0.25 for the decode
    activation_gb_per_mpx=0.9 * 1e6 / (LATENT.downscale**2 * TEMPORAL) / 1000 + 0.25,
    guidance="cfg",
    nodes=("nodes",),
    text_encoders=("Gemma3",),
    cfg_offset=0.0,  # the pipeline's guidance_scale g mixes uncond + g·(cond − uncond)
)
