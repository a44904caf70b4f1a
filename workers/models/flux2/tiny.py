"""A tiny random-weight FLUX.2 Klein stack, laid out as studios have FLUX.2 (`./farm models
smoke`, tests). The same seed always builds the same weights. What `write_smoke_stack` writes:

    diffusion_models/smoke-flux2-klein.safetensors   original / ComfyUI keys (+ .config.json)
    vae/smoke-flux2-vae.safetensors                  AutoencoderKLFlux2, original `ae` keys (+ .config.json)
    text_encoders/smoke-flux2-qwen3.safetensors      a Qwen3 (+ .config.json, .tokenizer/)

Sizes follow diffusers' own FLUX.2 Klein tests (tests/pipelines/flux2/): one double and one
single block, 2 heads of 16 (rope axes 4+4+4+4), but FLUX.2's real latent geometry (a 4-block
VAE of 32 channels, ÷8, patchified to 128 at ÷16) and random batch-norm statistics, so the
latent (de)normalisation is exercised. The Qwen3 has 28 layers (Klein reads hidden states 9, 18
and 27) of width 16, so the transformer's joint_attention_dim is 3 × 16. Its tokenizer is
byte-level with a Qwen3-style chat template (no download).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from workers.models.flux2 import keys

SMOKE = "smoke-flux2"
HIDDEN = 16  # the Qwen3's width
LAYERS = 28  # enough for hidden_states[27]
TRANSFORMER_CONFIG: dict[str, Any] = {
    "patch_size": 1, "in_channels": 128, "num_layers": 1, "num_single_layers": 1,
    "attention_head_dim": 16, "num_attention_heads": 2, "joint_attention_dim": 3 * HIDDEN,
    "timestep_guidance_channels": 256, "axes_dims_rope": [4, 4, 4, 4], "guidance_embeds": False,
}
VAE_CONFIG: dict[str, Any] = {
    "in_channels": 3, "out_channels": 3, "latent_channels": 32,
    "down_block_types": ["DownEncoderBlock2D"] * 4, "up_block_types": ["UpDecoderBlock2D"] * 4,
    "block_out_channels": [32, 32, 32, 32], "layers_per_block": 1, "norm_num_groups": 32,
    "sample_size": 64, "use_quant_conv": True, "use_post_quant_conv": True,
}
CHAT_TEMPLATE = (
    "{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)
SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>", "<think>", "</think>")


def tiny_tokenizer() -> Any:
    """A byte-level Qwen2Tokenizer: 256 byte tokens + Qwen's specials, a chat template, a pad."""
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {ch: i for i, ch in enumerate(bytes_to_unicode().values())}
    specials: dict[str, Any] = {"unk_token": None, "bos_token": None}  # byte-level: no unknowns
    tok: Any = Qwen2Tokenizer(vocab=vocab, merges=[], eos_token="<|im_end|>",
                              pad_token="<|endoftext|>", **specials)
    tok.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS)})
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_tiny_components(seed: int = 0) -> dict[str, Any]:
    """Fresh random modules (float32, CPU, eval) under Flux2KleinPipeline's component names."""
    from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2Transformer2DModel
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from workers.models.flux2.engine import scheduler_config

    tokenizer = tiny_tokenizer()
    torch.manual_seed(seed)
    transformer: Any = Flux2Transformer2DModel(**TRANSFORMER_CONFIG)
    vae: Any = AutoencoderKLFlux2(**VAE_CONFIG)
    with torch.no_grad():  # random latent statistics (a fresh BatchNorm's are 0 and 1)
        vae.bn.running_mean.copy_(torch.randn_like(vae.bn.running_mean) * 0.1)
        vae.bn.running_var.copy_(torch.rand_like(vae.bn.running_var) + 0.5)
    config = Qwen3Config(
        hidden_size=HIDDEN, intermediate_size=32, num_hidden_layers=LAYERS, num_attention_heads=2,
        num_key_value_heads=2, head_dim=8, vocab_size=len(tokenizer), max_position_embeddings=1024,
        tie_word_embeddings=False, pad_token_id=tokenizer.pad_token_id)
    config._attn_implementation = "sdpa"  # what from_pretrained picks when reloading
    text_encoder = Qwen3ForCausalLM(config)
    return {
        "transformer": transformer.eval(), "vae": vae.eval(), "text_encoder": text_encoder.eval(),
        "tokenizer": tokenizer,
        "scheduler": FlowMatchEulerDiscreteScheduler.from_config(scheduler_config()),
    }


def build_dev_transformer(seed: int = 1) -> Any:
    """A tiny FLUX.2 dev transformer: Klein's sizes with the distilled guidance embedding."""
    from diffusers import Flux2Transformer2DModel

    torch.manual_seed(seed)
    model: Any = Flux2Transformer2DModel(**{**TRANSFORMER_CONFIG, "guidance_embeds": True})
    return model.eval()


# Mistral's chat layout for the dev pipeline's messages (content lists of text parts).
MISTRAL_CHAT_TEMPLATE = (
    "{%- for m in messages %}{%- for c in m['content'] %}"
    "{%- if m['role'] == 'system' %}{{ '[SYSTEM_PROMPT]' + c['text'] + '[/SYSTEM_PROMPT]' }}"
    "{%- else %}{{ '[INST]' + c['text'] + '[/INST]' }}{%- endif %}{%- endfor %}{%- endfor %}"
)
MISTRAL_LAYERS = 31  # enough for hidden_states[30]


def build_mistral(seed: int = 2) -> tuple[Any, Any]:
    """A tiny FLUX.2 dev text encoder: a Mistral3ForConditionalGeneration of width 16 (so the
    transformer's joint_attention_dim, 3 × 16, fits), with a one-layer Pixtral vision tower,
    and its byte-level tokenizer with a Mistral-style chat template."""
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = MISTRAL_CHAT_TEMPLATE
    config = Mistral3Config(
        text_config={"model_type": "mistral", "hidden_size": HIDDEN, "intermediate_size": 32,
                     "num_hidden_layers": MISTRAL_LAYERS, "num_attention_heads": 2,
                     "num_key_value_heads": 2, "head_dim": 8, "vocab_size": len(tokenizer),
                     "max_position_embeddings": 1024, "pad_token_id": tokenizer.pad_token_id},
        vision_config={"model_type": "pixtral", "hidden_size": 16, "intermediate_size": 16,
                       "num_hidden_layers": 1, "num_attention_heads": 2, "head_dim": 8,
                       "image_size": 64, "patch_size": 16},
        image_token_index=len(tokenizer) - 1)
    torch.manual_seed(seed)
    return Mistral3ForConditionalGeneration(config).eval(), tokenizer


def write_dev_files(models_dir: Path, seed: int = 0) -> dict[str, str]:
    """FLUX.2 dev's tiny transformer (original keys) and Mistral3 text encoder (single file,
    config, tokenizer) beside the Klein stack's files; {"model_dev", "text_encoder_dev"}."""
    from safetensors.torch import save_file

    models_dir = Path(models_dir)
    for folder in ("diffusion_models", "text_encoders"):
        (models_dir / folder).mkdir(parents=True, exist_ok=True)
    names = {"model_dev": f"{SMOKE}-dev.safetensors",
             "text_encoder_dev": f"{SMOKE}-mistral3.safetensors"}
    transformer = models_dir / "diffusion_models" / names["model_dev"]
    save_file(keys.to_original(build_dev_transformer(seed + 1).state_dict()), transformer)
    _config(transformer, "Flux2Transformer2DModel", {**TRANSFORMER_CONFIG, "guidance_embeds": True})
    _single_file_encoder(*build_mistral(seed + 2),
                         models_dir / "text_encoders" / names["text_encoder_dev"])
    return names


def smoke_dev_pipeline(seed: int = 0) -> Any:
    """The reference `Flux2Pipeline` (dev) built from the same in-memory tiny modules
    `write_dev_files(seed=seed)` saves, with the Klein stack's VAE."""
    from diffusers import Flux2Pipeline

    parts = build_tiny_components(seed)
    text_encoder, tokenizer = build_mistral(seed + 2)
    pipe: Any = Flux2Pipeline(scheduler=parts["scheduler"], vae=parts["vae"],
                              text_encoder=text_encoder, tokenizer=tokenizer,
                              transformer=build_dev_transformer(seed + 1))
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
    names = {"model": f"{SMOKE}-klein.safetensors", "vae": f"{SMOKE}-vae.safetensors",
             "text_encoder": f"{SMOKE}-qwen3.safetensors"}
    transformer = models_dir / "diffusion_models" / names["model"]
    save_file(keys.to_original(parts["transformer"].state_dict()), transformer)
    _config(transformer, "Flux2Transformer2DModel", TRANSFORMER_CONFIG)
    vae = models_dir / "vae" / names["vae"]
    save_file(original_vae_keys(parts["vae"].state_dict()), vae)
    _config(vae, "AutoencoderKLFlux2", VAE_CONFIG)
    _single_file_encoder(parts["text_encoder"], parts["tokenizer"],
                         models_dir / "text_encoders" / names["text_encoder"])
    return names


def original_vae_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Diffusers AutoencoderKLFlux2 keys → the original `ae` layout (FLUX.1's VAE layout, whose
    inverse of diffusers' converter the Z-Image stack already writes; the batch-norm
    statistics keep their names)."""
    from workers.models.zimage.tiny import to_original_flux_vae_keys

    return {k: v.contiguous() for k, v in to_original_flux_vae_keys(dict(state)).items()}


def smoke_pipeline(seed: int = 0) -> Any:
    """The reference `Flux2KleinPipeline` built from the same in-memory tiny modules
    `write_smoke_stack(seed=seed)` saves."""
    from diffusers import Flux2KleinPipeline

    pipe: Any = Flux2KleinPipeline(**build_tiny_components(seed))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _single_file_encoder(model: Any, tokenizer: Any, path: Path) -> None:
    """`<stem>.safetensors` + `<stem>.config.json` + `<stem>.tokenizer/`, as ComfyUI users keep
    text encoders (transformers' own save)."""
    stem = path.name.removesuffix(".safetensors")
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        shutil.copy(Path(folder) / "model.safetensors", path)
        shutil.copy(Path(folder) / "config.json", path.with_name(f"{stem}.config.json"))
    tokenizer.save_pretrained(path.with_name(f"{stem}.tokenizer"))


def _config(path: Path, class_name: str, config: dict[str, Any]) -> None:
    stem = path.name.removesuffix(".safetensors")
    path.with_name(f"{stem}.config.json").write_text(
        json.dumps({"_class_name": class_name, **config}, indent=2) + "\n")


LORA_TARGETS = ("transformer_blocks.0.attn.to_q", "transformer_blocks.0.attn.add_k_proj",
                "transformer_blocks.0.ff.linear_in", "single_transformer_blocks.0.attn.to_qkv_mlp_proj",
                "single_transformer_blocks.0.attn.to_out")


def write_tiny_lora(models_dir: Path, name: str = f"{SMOKE}-lora.safetensors", seed: int = 0,
                    rank: int = 4) -> str:
    """A random LoRA of the tiny transformer in diffusers / PEFT keys
    (`transformer.<module>.lora_A.weight` [r, in], `.lora_B.weight` [out, r]), as FLUX.2
    trainers publish them, under `loras/<name>`; returns the name. Other seeds: other LoRAs."""
    from diffusers import Flux2Transformer2DModel
    from safetensors.torch import save_file

    with torch.device("meta"):
        model: Any = Flux2Transformer2DModel(**TRANSFORMER_CONFIG)
    modules = dict(model.named_modules())
    generator = torch.Generator("cpu").manual_seed(4000 + seed)
    state: dict[str, torch.Tensor] = {}
    for target in LORA_TARGETS:
        linear = modules[target]
        state[f"transformer.{target}.lora_A.weight"] = torch.randn(
            rank, linear.in_features, generator=generator) * 0.3
        state[f"transformer.{target}.lora_B.weight"] = torch.randn(
            linear.out_features, rank, generator=generator) * 0.3
    (Path(models_dir) / "loras").mkdir(parents=True, exist_ok=True)
    save_file(state, Path(models_dir) / "loras" / name)
    return name
