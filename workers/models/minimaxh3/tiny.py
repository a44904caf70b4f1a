"""A tiny random-weight MiniMax-H3 stack (tests). The same seed always builds the same weights.

`write_folder(path)` writes it as diffusers lays MiniMax-H3 out (`transformer/`, `vae/`,
`audio_vae/`, `text_encoder/`, `tokenizer/` with the processor, a `model_index.json` naming
`MiniMaxH3ModularPipeline`), `write_transformer_file` the
transformer as ComfyUI's single file; `smoke_pipeline()` is the
reference `MiniMaxH3ModularPipeline` over the same in-memory modules.

diffusers ships no tiny MiniMax-H3 configs (its tests read a hub repo), so these are the smallest
the classes accept while keeping the released geometry: the transformer's (1, 2, 2) patches of
24-channel latents, heads of 12 (= 2 · 3 axes · rope_freq_dim 2), the video VAE's ÷16 space and
17n + 5 → 5n + 2 time at width 8, the audio VAE at a hop of 4 samples (160 Hz: 40 latents per
second) with 8 latent channels, and a Qwen3-VL of width 16 with 51 layers: MiniMax-H3 reads
`hidden_states[50]`. The tokenizer is qwenimage's byte-level Qwen2 one (no download).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from workers.models.minimaxh3 import PIPELINE
from workers.models.qwenimage.tiny import tiny_tokenizer

TEXT_WIDTH = 16
TRANSFORMER_CONFIG: dict[str, Any] = {
    "num_attention_heads": 2, "attention_head_dim": 12, "hidden_size": 24, "num_layers": 2,
    "num_refiner_layers": 1, "ffn_dim": 32, "in_channels": 24, "audio_in_channels": 8,
    "text_dim": TEXT_WIDTH, "freq_dim": 16, "time_embed_hidden_dim": 24, "time_embed_dim": 16,
    "rope_freq_dim": 2,
}
VIDEO_VAE_CONFIG: dict[str, Any] = {
    "block_out_channels": (8,) * 6, "norm_num_groups": 4, "decoder_num_layers": 1,
    "decoder_num_attention_heads": 2, "decoder_attention_head_dim": 8,
    "latents_mean": (0.1,) * 24, "latents_std": (0.9,) * 24,
}
AUDIO_VAE_CONFIG: dict[str, Any] = {
    "encoder_dim": 4, "encoder_rates": (2, 2), "latent_dim": 32, "latent_channels": 8,
    "num_attention_heads": 2, "decoder_dim": 8, "decoder_rates": (2, 2),
    "decoder_kernel_sizes": (4, 4), "resblock_kernel_sizes": (3,),
    "resblock_dilation_sizes": ((1,),), "sampling_rate": 160,
    "latents_mean": [0.1] * 8, "latents_std": [0.9] * 8,
}
SMOKE = "smoke-minimaxh3"  # `./farm models smoke`'s folder in checkpoints/
SUBFOLDERS = ("transformer", "vae", "audio_vae", "text_encoder")
COMPONENTS = {  # the folder's model_index.json: each component's library and class
    "transformer": ["diffusers", "MiniMaxH3Transformer3DModel"],
    "vae": ["diffusers", "AutoencoderKLMiniMaxH3"],
    "audio_vae": ["diffusers", "AutoencoderKLMiniMaxH3Audio"],
    "text_encoder": ["transformers", "Qwen3VLForConditionalGeneration"],
    "tokenizer": ["transformers", "Qwen2TokenizerFast"],
}


def text_encoder_config(tokenizer: Any) -> Any:
    from transformers import Qwen3VLConfig

    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in (
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"),
        ("image_token_id", "<|image_pad|>"))}
    return Qwen3VLConfig(
        text_config={"hidden_size": TEXT_WIDTH, "intermediate_size": 16, "num_hidden_layers": 51,
                     "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 8,
                     "rope_scaling": {"mrope_section": [1, 1, 2], "rope_type": "default",
                                      "mrope_interleaved": True},
                     "vocab_size": len(tokenizer)},
        vision_config={"depth": 2, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2,
                       "out_hidden_size": TEXT_WIDTH, "deepstack_visual_indexes": [1],
                       "patch_size": 16, "spatial_merge_size": 2, "num_position_embeddings": 16},
        video_token_id=len(tokenizer) + 1, **ids)


def tiny_processor(tokenizer: Any) -> Any:
    """The image + text processor of the tiny tokenizer (Qwen3-VL's 16-px patches merged 2×2,
    as the tiny vision tower reads them)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    from workers.models.qwenimage.vl import ImageTextProcessor

    return ImageTextProcessor(image_processor=Qwen2VLImageProcessorPil(patch_size=16, merge_size=2),
                              tokenizer=tokenizer)


def build_tiny_components(seed: int = 0) -> dict[str, Any]:
    """Fresh random modules (float32, CPU, eval) under MiniMaxH3ModularPipeline's names."""
    from diffusers import (
        AutoencoderKLMiniMaxH3,
        AutoencoderKLMiniMaxH3Audio,
        MiniMaxH3Transformer3DModel,
    )
    from transformers import Qwen3VLForConditionalGeneration

    tokenizer = tiny_tokenizer()
    torch.manual_seed(seed)
    transformer: Any = MiniMaxH3Transformer3DModel(**TRANSFORMER_CONFIG)
    vae: Any = AutoencoderKLMiniMaxH3(**VIDEO_VAE_CONFIG)
    audio_vae: Any = AutoencoderKLMiniMaxH3Audio(**AUDIO_VAE_CONFIG)
    text_encoder: Any = Qwen3VLForConditionalGeneration(text_encoder_config(tokenizer))
    return {"transformer": transformer.eval(), "vae": vae.eval(), "audio_vae": audio_vae.eval(),
            "text_encoder": text_encoder.eval(), "tokenizer": tokenizer,
            "processor": tiny_processor(tokenizer)}


def write_folder(path: Path, seed: int = 0) -> Path:
    """The tiny stack as a diffusers MiniMax-H3 folder at `path` (one subfolder per component)."""
    parts = build_tiny_components(seed)
    path = Path(path)
    for name in SUBFOLDERS:
        parts[name].save_pretrained(path / name)
    parts["tokenizer"].save_pretrained(path / "tokenizer")
    parts["processor"].save_pretrained(path / "tokenizer")
    (path / "model_index.json").write_text(json.dumps({"_class_name": PIPELINE, **COMPONENTS},
                                                      indent=2) + "\n")
    return path


def write_transformer_file(path: Path, seed: int = 0) -> Path:
    """The tiny transformer as ComfyUI's single file at `path` (its keys, `model.diffusion_model.`
    prefix) with its `<stem>.config.json`."""
    from safetensors.torch import save_file

    from workers.models.minimaxh3 import keys

    transformer = build_tiny_components(seed)["transformer"]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(keys.to_original(transformer.state_dict()), path)
    path.with_name(path.name.removesuffix(".safetensors") + ".config.json").write_text(
        json.dumps({"_class_name": "MiniMaxH3Transformer3DModel", **TRANSFORMER_CONFIG}) + "\n")
    return path


def reference_transformer(seed: int = 0) -> Any:
    """The ref2va partition (`transformer_ref/`): the same architecture, its own random weights."""
    from diffusers import MiniMaxH3Transformer3DModel

    torch.manual_seed(seed + 1)
    transformer: Any = MiniMaxH3Transformer3DModel(**TRANSFORMER_CONFIG)
    return transformer.eval()


def smoke_pipeline(seed: int = 0, shifts: tuple[float, float] = (12.0, 3.0)) -> Any:
    """The reference `MiniMaxH3ModularPipeline` over the in-memory modules `write_folder(seed=seed)`
    saves and the ref2va partition (reference_transformer), with its two schedulers (video
    shift 12, audio shift 3 unless `shifts` says)."""
    from diffusers import MiniMaxH3Scheduler
    from diffusers.modular_pipelines import MiniMaxH3Blocks

    blocks: Any = MiniMaxH3Blocks()
    pipe: Any = blocks.init_pipeline()
    pipe.update_components(**build_tiny_components(seed), transformer_ref=reference_transformer(seed),
                           scheduler=MiniMaxH3Scheduler(shift=shifts[0]),
                           audio_scheduler=MiniMaxH3Scheduler(shift=shifts[1]))
    pipe.set_progress_bar_config(disable=True)
    return pipe


FILES = {"diffusion_model": ("diffusion_models", "smoke-minimaxh3.safetensors"),
         "vae": ("vae", "smoke-minimaxh3-video-vae"),
         "audio_vae": ("vae", "smoke-minimaxh3-audio-vae"),
         "text_encoder": ("text_encoders", "smoke-minimaxh3-qwen3vl")}


def write_tiny_files(models_dir: Path, seed: int = 0) -> dict[str, str]:
    """The tiny stack as ComfyUI's templates load it, one part per loader: the transformer as
    ComfyUI's single file in diffusion_models/, the video and audio VAEs as diffusers component
    folders in vae/, the Qwen3-VL with its tokenizer and processor in text_encoders/; returns
    the names by loading.FILE_ROLES."""
    parts = build_tiny_components(seed)
    write_transformer_file(models_dir / FILES["diffusion_model"][0] / FILES["diffusion_model"][1],
                           seed)
    for role, component in (("vae", "vae"), ("audio_vae", "audio_vae"),
                            ("text_encoder", "text_encoder")):
        parts[component].save_pretrained(models_dir / FILES[role][0] / FILES[role][1])
    encoder = models_dir / FILES["text_encoder"][0] / FILES["text_encoder"][1]
    parts["tokenizer"].save_pretrained(encoder)
    parts["processor"].save_pretrained(encoder)
    return {role: name for role, (_, name) in FILES.items()}
