"""A tiny random-weight Qwen-Image 2.1 stack, laid out as ComfyUI users keep files:

    diffusion_models/smoke-qwenimage21.safetensors       transformer (`model.diffusion_model.`
                                                          + diffusers' keys, + .config.json)
    vae/smoke-qwenimage21-vae.safetensors                AutoencoderKLQwenImage21 (+ .config.json)
    text_encoders/smoke-qwenimage21-qwen3vl.safetensors  Qwen3-VL in its checkpoint keys
                                                          (+ .config.json, .tokenizer/ with the
                                                          Qwen2-VL image processor's files)
    loras/smoke-qwenimage21-lora.safetensors             a random LoRA (`write_tiny_lora`)

Sizes: 2 single-stream blocks of 2 heads of 16 (rope axes 4+6+6), a 2-layer Qwen3-VL of width
16 (= context_in_dim) with a 2-block vision tower (16-px patches merged 2×2: one slot per 32 px,
as 2.1 reads them), a VAE of width 16 with 2.1's geometry (64 latent channels, RGBA, ÷16). The
tokenizer is Qwen-Image's tiny byte-level one with the video pad Qwen3-VL's config names.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from workers.models.qwenimage import tiny as qwen_tiny
from workers.models.qwenimage21 import DIFFUSION_PREFIX

SMOKE = "smoke-qwenimage21"
WIDTH = 16
TRANSFORMER_CONFIG: dict[str, Any] = {
    "num_layers": 2, "attention_head_dim": 16, "num_attention_heads": 2,
    "context_in_dim": WIDTH, "axes_dims_rope": [4, 6, 6],
}
VAE_CONFIG: dict[str, Any] = {
    "base_dim": 16, "decoder_base_dim": 16, "dim_mult": [1, 2, 2, 2, 2], "num_res_blocks": 1,
    "temperal_downsample": [False, True, True, True],
}
# the system turn Qwen3-VL's chat template writes (the pipeline tokenizes it to count the
# tokens it drops)
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% for c in m['content'] %}"
                 "{{ c['text'] }}{% endfor %}<|im_end|>\n{% endfor %}")


def tiny_tokenizer() -> Any:
    tok = qwen_tiny.tiny_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|video_pad|>"]})
    tok.chat_template = CHAT_TEMPLATE
    return tok


def text_encoder_config(tokenizer: Any) -> Any:
    from transformers import Qwen3VLConfig

    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in (
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"),
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"))}
    return Qwen3VLConfig(
        text_config={"hidden_size": WIDTH, "intermediate_size": 16, "num_hidden_layers": 2,
                     "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 8,
                     "vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0,
                                         "mrope_section": [2, 1, 1], "mrope_interleaved": True}},
        vision_config={"depth": 2, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2,
                       "out_hidden_size": WIDTH, "deepstack_visual_indexes": [1],
                       "num_position_embeddings": 64},
        **ids)


def tiny_processor(tokenizer: Any) -> Any:
    """The Qwen3-VL processor of the tiny tokenizer (16-px patches merged 2×2)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    from workers.models.qwenimage21.engine import ImageTextProcessor

    return ImageTextProcessor(image_processor=Qwen2VLImageProcessorPil(patch_size=16, merge_size=2),
                              tokenizer=tokenizer, chat_template=CHAT_TEMPLATE)


def build_tiny_components(seed: int = 0) -> dict[str, Any]:
    """Fresh random modules (float32, CPU, eval) under QwenImage21Pipeline's component names."""
    from diffusers import (
        AutoencoderKLQwenImage21,
        FlowMatchEulerDiscreteScheduler,
        QwenImage21Transformer2DModel,
    )
    from transformers import Qwen3VLForConditionalGeneration

    from workers.models.qwenimage21.engine import scheduler_config

    tokenizer = tiny_tokenizer()
    torch.manual_seed(seed)
    transformer: Any = QwenImage21Transformer2DModel(**TRANSFORMER_CONFIG)
    vae: Any = AutoencoderKLQwenImage21(**VAE_CONFIG)
    text_encoder: Any = Qwen3VLForConditionalGeneration(text_encoder_config(tokenizer))
    return {
        "transformer": transformer.eval(), "vae": vae.eval(), "text_encoder": text_encoder.eval(),
        "processor": tiny_processor(tokenizer),
        "scheduler": FlowMatchEulerDiscreteScheduler.from_config(scheduler_config()),
    }


def smoke_pipeline(seed: int = 0) -> Any:
    """The reference `QwenImage21Pipeline` built from the same in-memory tiny modules
    `write_smoke_stack(seed=seed)` saves."""
    from diffusers import QwenImage21Pipeline

    pipe: Any = QwenImage21Pipeline(**build_tiny_components(seed))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def write_smoke_stack(models_dir: Path, seed: int = 0) -> dict[str, str]:
    """Write the tiny stack under `models_dir`; the file name per role:
    {"model", "vae", "text_encoder"}."""
    from safetensors.torch import save_file

    parts = build_tiny_components(seed)
    models_dir = Path(models_dir)
    for folder in ("diffusion_models", "vae", "text_encoders"):
        (models_dir / folder).mkdir(parents=True, exist_ok=True)
    names = {"model": f"{SMOKE}.safetensors", "vae": f"{SMOKE}-vae.safetensors",
             "text_encoder": f"{SMOKE}-qwen3vl.safetensors"}
    transformer = models_dir / "diffusion_models" / names["model"]
    save_file({DIFFUSION_PREFIX + k: v.contiguous()
               for k, v in parts["transformer"].state_dict().items()}, transformer)
    _config(transformer, "QwenImage21Transformer2DModel", TRANSFORMER_CONFIG)
    vae = models_dir / "vae" / names["vae"]
    save_file({k: v.contiguous() for k, v in parts["vae"].state_dict().items()}, vae)
    _config(vae, "AutoencoderKLQwenImage21", VAE_CONFIG)
    path = models_dir / "text_encoders" / names["text_encoder"]
    stem = path.name.removesuffix(".safetensors")
    with tempfile.TemporaryDirectory() as folder:
        parts["text_encoder"].save_pretrained(folder)
        shutil.copy(Path(folder) / "model.safetensors", path)
        shutil.copy(Path(folder) / "config.json", path.with_name(f"{stem}.config.json"))
    parts["processor"].save_pretrained(path.with_name(f"{stem}.tokenizer"))
    return names


def _config(path: Path, class_name: str, config: dict[str, Any]) -> None:
    stem = path.name.removesuffix(".safetensors")
    path.with_name(f"{stem}.config.json").write_text(
        json.dumps({"_class_name": class_name, **config}, indent=2) + "\n")


def write_tiny_lora(models_dir: Path, name: str = f"{SMOKE}-lora.safetensors", seed: int = 0,
                    rank: int = 4) -> str:
    """A random LoRA of the tiny transformer in diffusers / PEFT keys
    (`transformer.transformer_blocks.0.attn.to_q.lora_A.weight`, `.lora_B.weight`) on block 0's
    attention projections and block 1's SwiGLU gate (2.1's own name: what tells the file from a
    Qwen-Image or FLUX.1 LoRA at this width), under `loras/<name>`; returns the name."""
    from workers.models.lora import random_lora, save_lora

    d = TRANSFORMER_CONFIG["num_attention_heads"] * TRANSFORMER_CONFIG["attention_head_dim"]
    targets = {  # module: (in, out); the MLP is 3× wide (mlp_ratio)
        "transformer_blocks.0.attn.to_q": (d, d), "transformer_blocks.0.attn.to_k": (d, d),
        "transformer_blocks.0.attn.to_v": (d, d), "transformer_blocks.0.attn.to_out.0": (d, d),
        "transformer_blocks.1.img_mlp.gate_layer": (d, 3 * d),
    }
    generator = torch.Generator("cpu").manual_seed(3000 + seed)
    state = random_lora(targets, generator, prefix="transformer.", scale=1.0, rank=rank)
    return save_lora(models_dir, name, state)
