"""A tiny random-weight Krea 2 stack, laid out as studios have Krea 2 (`./farm models smoke`,
tests). The same seed always builds the same weights. What `write_smoke_stack` writes:

    diffusion_models/smoke-krea2.safetensors       the original keys ComfyUI ships
                                                   (`model.diffusion_model.blocks.0.attn.wq`,
                                                   `txtfusion.`) (+ .config.json)
    vae/smoke-krea2-vae.safetensors                AutoencoderKLQwenImage, diffusers' keys
                                                   (+ .config.json)
    text_encoders/smoke-krea2-qwen3vl.safetensors  Qwen3-VL in its checkpoint keys
                                                   (`model.language_model.layers`, `model.visual.`)
                                                   (+ .config.json, .tokenizer/)

Sizes: 2 blocks of 2 query heads of 16 over 1 key/value head (rope axes 4+6+6), text fusion of
one layerwise and one refiner block over 2 taps of a 6-layer Qwen3-VL of width 16 (taps 2 and 5,
the pipeline's every-third rule) with a 1-block vision tower; the VAE keeps Qwen-Image's geometry
at width 16. The tokenizer is byte-level with Qwen's chat and vision specials (no download).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from workers.models.krea2 import DIFFUSION_PREFIX, LATENT, keys

SMOKE = "smoke-krea2"
WIDTH = 16  # the text encoder's hidden size == the transformer's text_hidden_dim
TE_LAYERS = 6  # taps (2, 5)
TRANSFORMER_CONFIG: dict[str, Any] = {
    "in_channels": 4 * LATENT.channels, "num_layers": 2, "attention_head_dim": 16,
    "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 64,
    "timestep_embed_dim": 32, "text_hidden_dim": WIDTH, "num_text_layers": 2,
    "text_num_attention_heads": 2, "text_num_key_value_heads": 2, "text_intermediate_size": 32,
    "num_layerwise_text_blocks": 1, "num_refiner_text_blocks": 1, "axes_dims_rope": [4, 6, 6],
}
VAE_CONFIG: dict[str, Any] = {
    "base_dim": 16, "z_dim": LATENT.channels, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 2,
    "temperal_downsample": [False, True, True],
}
SPECIALS = ("<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
            "<|video_pad|>")


def tiny_tokenizer() -> Any:
    """A byte-level Qwen2Tokenizer (256 byte tokens) with Qwen's chat and vision specials and
    its pad token."""
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {ch: i for i, ch in enumerate(bytes_to_unicode().values())}
    specials: dict[str, Any] = {"unk_token": None, "bos_token": None}
    tok: Any = Qwen2Tokenizer(vocab=vocab, merges=[], eos_token="<|im_end|>",
                              pad_token="<|endoftext|>", **specials)
    tok.add_special_tokens({"additional_special_tokens": list(SPECIALS)})
    return tok


def text_encoder_config(tokenizer: Any) -> Any:
    from transformers import Qwen3VLConfig

    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in (
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"),
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"))}
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    return Qwen3VLConfig(
        text_config={"hidden_size": WIDTH, "intermediate_size": 32, "num_hidden_layers": TE_LAYERS,
                     "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0,
                                         "mrope_section": [2, 1, 1], "mrope_interleaved": True},
                     "vocab_size": len(tokenizer), "bos_token_id": eos, "eos_token_id": eos,
                     "pad_token_id": pad},
        vision_config={"depth": 1, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2,
                       "out_hidden_size": WIDTH, "deepstack_visual_indexes": [0],
                       "num_position_embeddings": 16},
        **ids)


def build_tiny_components(seed: int = 0) -> dict[str, Any]:
    """Fresh random modules (float32, CPU, eval) under Krea2Pipeline's component names."""
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler
    from diffusers.models import Krea2Transformer2DModel
    from transformers import Qwen3VLModel

    from workers.models.krea2.engine import scheduler_config

    tokenizer = tiny_tokenizer()
    torch.manual_seed(seed)
    transformer: Any = Krea2Transformer2DModel(**TRANSFORMER_CONFIG)
    with torch.no_grad():  # the zero-initialised tables and norm scales: random too
        for name, param in transformer.named_parameters():
            if "scale_shift_table" in name or name.endswith("norm.weight") or ".norm" in name:
                param.normal_(0.0, 0.2)
    vae: Any = AutoencoderKLQwenImage(**VAE_CONFIG)
    text_encoder: Any = Qwen3VLModel(text_encoder_config(tokenizer))
    return {
        "transformer": transformer.eval(), "vae": vae.eval(),
        "text_encoder": text_encoder.eval(), "tokenizer": tokenizer,
        "scheduler": FlowMatchEulerDiscreteScheduler.from_config(scheduler_config()),
    }


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
    original = keys.to_original(dict(parts["transformer"].state_dict()))
    save_file({DIFFUSION_PREFIX + k: v.contiguous() for k, v in original.items()}, transformer)
    _config(transformer, "Krea2Transformer2DModel", TRANSFORMER_CONFIG)
    vae = models_dir / "vae" / names["vae"]
    save_file({k: v.contiguous() for k, v in parts["vae"].state_dict().items()}, vae)
    _config(vae, "AutoencoderKLQwenImage", VAE_CONFIG)
    _single_file_encoder(parts["text_encoder"], parts["tokenizer"],
                         models_dir / "text_encoders" / names["text_encoder"])
    return names


def smoke_pipeline(seed: int = 0) -> Any:
    """The reference `Krea2Pipeline` built from the same in-memory tiny modules
    `write_smoke_stack(seed=seed)` saves (taps (2, 5) of the 6-layer encoder)."""
    from diffusers import Krea2Pipeline

    from workers.models.krea2.engine import taps

    parts = build_tiny_components(seed)
    pipe: Any = Krea2Pipeline(**parts, text_encoder_select_layers=taps(parts["text_encoder"]))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _single_file_encoder(model: Any, tokenizer: Any, path: Path) -> None:
    """`<stem>.safetensors` + `<stem>.config.json` + `<stem>.tokenizer/`, as ComfyUI users keep
    text encoders: the Qwen3-VL checkpoint's key layout (Qwen3VLForConditionalGeneration's save,
    its lm_head tied to the embeddings and left out)."""
    from transformers import Qwen3VLForConditionalGeneration

    full: Any = Qwen3VLForConditionalGeneration(model.config)
    full.model.load_state_dict(model.state_dict())
    stem = path.name.removesuffix(".safetensors")
    with tempfile.TemporaryDirectory() as folder:
        full.save_pretrained(folder)
        shutil.copy(Path(folder) / "model.safetensors", path)
        shutil.copy(Path(folder) / "config.json", path.with_name(f"{stem}.config.json"))
    tokenizer.save_pretrained(path.with_name(f"{stem}.tokenizer"))


def _config(path: Path, class_name: str, config: dict[str, Any]) -> None:
    stem = path.name.removesuffix(".safetensors")
    path.with_name(f"{stem}.config.json").write_text(
        json.dumps({"_class_name": class_name, **config}, indent=2) + "\n")


def write_tiny_lora(models_dir: Path, name: str = f"{SMOKE}-lora.safetensors", seed: int = 0,
                    rank: int = 4) -> str:
    """A random LoRA of the tiny transformer in the original / ComfyUI keys
    (`diffusion_model.blocks.0.attn.wq.lora_A.weight`, `.lora_B.weight`), as Krea 2's
    reference trainer writes them, under `loras/<name>`; returns the name."""
    from workers.models.lora import random_lora, save_lora

    d = TRANSFORMER_CONFIG["num_attention_heads"] * TRANSFORMER_CONFIG["attention_head_dim"]
    kv = TRANSFORMER_CONFIG["num_key_value_heads"] * TRANSFORMER_CONFIG["attention_head_dim"]
    ff = TRANSFORMER_CONFIG["intermediate_size"]
    targets = {  # module: (in, out)
        "blocks.0.attn.wq": (d, d), "blocks.0.attn.wk": (d, kv), "blocks.0.attn.wo": (d, d),
        "blocks.1.mlp.gate": (d, ff), "blocks.1.mlp.down": (ff, d),
    }
    generator = torch.Generator("cpu").manual_seed(3000 + seed)
    state = random_lora(targets, generator, prefix="diffusion_model.", rank=rank)
    return save_lora(models_dir, name, state)
