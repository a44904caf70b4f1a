"""A tiny random-weight FLUX.1 stack, laid out as studios have FLUX.1 (`./farm models smoke`,
tests). The same seed always builds the same weights. What `write_smoke_stack` writes:

    diffusion_models/smoke-flux1-dev.safetensors   original / ComfyUI keys (+ .config.json)
    vae/smoke-flux1-ae.safetensors                 the 16-channel FLUX VAE (+ .config.json)
    text_encoders/smoke-flux1-clip-l.safetensors   CLIP-L (+ .config.json, .tokenizer/)
    text_encoders/smoke-flux1-t5xxl.safetensors    T5 encoder (+ .config.json, .tokenizer/)

and `write_fill_transformer` a FLUX.1 Fill transformer (384 channels in, 64 out) beside them:
    diffusion_models/smoke-flux1-fill-dev.safetensors

Sizes follow diffusers' own FLUX tests (tests/pipelines/flux/): one double and one single
block, 2 heads of 16 (rope axes 4+4+8), T5 width 32 = joint_attention_dim, CLIP width 32 =
pooled_projection_dim; the VAE has 4 blocks (÷8) as FLUX's. Tokenizers are byte-level (no
download); CLIP's pads to 77, T5's to 512.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from workers.models.flux1 import keys

SMOKE = "smoke-flux1"
WIDTH = 32  # the text encoders' hidden size
TRANSFORMER_CONFIG: dict[str, Any] = {
    "patch_size": 1, "in_channels": 64, "num_layers": 1, "num_single_layers": 1,
    "attention_head_dim": 16, "num_attention_heads": 2, "joint_attention_dim": WIDTH,
    "pooled_projection_dim": WIDTH, "guidance_embeds": True, "axes_dims_rope": [4, 4, 8],
}
FILL_CONFIG = {**TRANSFORMER_CONFIG, "in_channels": 384, "out_channels": 64}  # FLUX.1 Fill
VAE_CONFIG: dict[str, Any] = {
    "in_channels": 3, "out_channels": 3, "latent_channels": 16,
    "down_block_types": ["DownEncoderBlock2D"] * 4, "up_block_types": ["UpDecoderBlock2D"] * 4,
    "block_out_channels": [32, 32, 32, 32], "layers_per_block": 1, "norm_num_groups": 32,
    "sample_size": 64, "scaling_factor": 0.3611, "shift_factor": 0.1159,
    "use_quant_conv": False, "use_post_quant_conv": False, "force_upcast": True,
}


def tiny_tokenizer(max_length: int) -> Any:
    """A byte-level tokenizer (256 byte tokens, a pad and an end token) padding to max_length."""
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {ch: i for i, ch in enumerate(bytes_to_unicode().values())}
    specials: dict[str, Any] = {"unk_token": None, "bos_token": None}
    tok: Any = Qwen2Tokenizer(vocab=vocab, merges=[], eos_token="</s>", pad_token="<pad>",
                              **specials)
    tok.model_max_length = max_length
    return tok


def build_tiny_components(seed: int = 0, fill: bool = False) -> dict[str, Any]:
    """Fresh random modules (float32, CPU, eval) under FluxPipeline's component names; with
    `fill`, the Fill transformer (the other modules as without)."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    from workers.models.flux1.engine import scheduler_config

    clip_tok, t5_tok = tiny_tokenizer(77), tiny_tokenizer(512)
    torch.manual_seed(seed)
    transformer: Any = FluxTransformer2DModel(**TRANSFORMER_CONFIG)
    vae: Any = AutoencoderKL(**VAE_CONFIG)
    clip = CLIPTextModel(CLIPTextConfig(
        hidden_size=WIDTH, intermediate_size=37, num_attention_heads=4, num_hidden_layers=2,
        vocab_size=len(clip_tok), max_position_embeddings=77, projection_dim=WIDTH,
        hidden_act="gelu", eos_token_id=clip_tok.eos_token_id, pad_token_id=clip_tok.pad_token_id,
        bos_token_id=clip_tok.pad_token_id))
    t5 = T5EncoderModel(T5Config(
        vocab_size=len(t5_tok), d_model=WIDTH, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, pad_token_id=t5_tok.pad_token_id,
        eos_token_id=t5_tok.eos_token_id))
    if fill:
        torch.manual_seed(seed)
        transformer = FluxTransformer2DModel(**FILL_CONFIG)
    return {
        "transformer": transformer.eval(), "vae": vae.eval(),
        "text_encoder": clip.eval(), "tokenizer": clip_tok,
        "text_encoder_2": t5.eval(), "tokenizer_2": t5_tok,
        "scheduler": FlowMatchEulerDiscreteScheduler.from_config(scheduler_config()),
    }


def write_smoke_stack(models_dir: Path, seed: int = 0) -> dict[str, str]:
    """Write the tiny stack under `models_dir`; the file name per role:
    {"model", "vae", "text_encoder" (CLIP-L), "text_encoder_2" (T5)}."""
    from safetensors.torch import save_file

    parts = build_tiny_components(seed)
    models_dir = Path(models_dir)
    for folder in ("diffusion_models", "vae", "text_encoders"):
        (models_dir / folder).mkdir(parents=True, exist_ok=True)
    names = {"model": f"{SMOKE}-dev.safetensors", "vae": f"{SMOKE}-ae.safetensors",
             "text_encoder": f"{SMOKE}-clip-l.safetensors",
             "text_encoder_2": f"{SMOKE}-t5xxl.safetensors"}

    transformer = models_dir / "diffusion_models" / names["model"]
    save_file(keys.to_original(parts["transformer"].state_dict()), transformer)
    _config(transformer, "FluxTransformer2DModel", TRANSFORMER_CONFIG)
    vae = models_dir / "vae" / names["vae"]
    save_file({k: v.contiguous() for k, v in parts["vae"].state_dict().items()}, vae)
    _config(vae, "AutoencoderKL", VAE_CONFIG)
    for model, tok, role in (("text_encoder", "tokenizer", "text_encoder"),
                             ("text_encoder_2", "tokenizer_2", "text_encoder_2")):
        _single_file_encoder(parts[model], parts[tok], models_dir / "text_encoders" / names[role])
    return names


def write_fill_transformer(models_dir: Path, seed: int = 0) -> str:
    """The tiny FLUX.1 Fill transformer (original keys) under diffusion_models/; returns its
    name. Its sidecar config is FLUX.1's own (64 channels), as the shipped full-size one is: the
    loader reads Fill's channels from the weights."""
    from safetensors.torch import save_file

    name = f"{SMOKE}-fill-dev.safetensors"
    (Path(models_dir) / "diffusion_models").mkdir(parents=True, exist_ok=True)
    transformer = build_tiny_components(seed, fill=True)["transformer"]
    path = Path(models_dir) / "diffusion_models" / name
    save_file(keys.to_original(transformer.state_dict()), path)
    _config(path, "FluxTransformer2DModel", TRANSFORMER_CONFIG)
    return name


def smoke_pipeline(img2img: bool = False, seed: int = 0, kontext: bool = False,
                   fill: bool = False) -> Any:
    """The reference `FluxPipeline` (or `FluxImg2ImgPipeline`, `FluxKontextPipeline`, or with
    `fill` `FluxFillPipeline` on `write_fill_transformer`'s) built from the same in-memory tiny
    modules `write_smoke_stack(seed=seed)` saves."""
    from diffusers import FluxFillPipeline, FluxImg2ImgPipeline, FluxKontextPipeline, FluxPipeline

    cls = (FluxFillPipeline if fill else FluxKontextPipeline if kontext
           else FluxImg2ImgPipeline if img2img else FluxPipeline)
    pipe: Any = cls(**build_tiny_components(seed, fill=fill))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _single_file_encoder(model: Any, tokenizer: Any, path: Path) -> None:
    """`<stem>.safetensors` + `<stem>.config.json` + `<stem>.tokenizer/`, as ComfyUI users keep
    text encoders (transformers' own save, so tied weights are written once)."""
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


def write_tiny_lora(models_dir: Path, name: str = f"{SMOKE}-lora.safetensors", seed: int = 0,
                    rank: int = 4, alpha: float = 2.0, text_encoder: bool = False) -> str:
    """A random LoRA of the tiny transformer in kohya / ComfyUI keys (`lora_unet_double_blocks_
    0_img_attn_qkv.lora_down.weight`, `.lora_up.weight`, `.alpha`), as FLUX.1 trainers publish
    them, under `loras/<name>`; returns the name. Other seeds: other LoRAs. With
    `text_encoder`, CLIP-L's half too (`lora_te1_…`)."""
    from safetensors.torch import save_file

    from workers.models.lora import random_clip_lora

    d = TRANSFORMER_CONFIG["num_attention_heads"] * TRANSFORMER_CONFIG["attention_head_dim"]
    targets = {  # kohya module: (in, out)
        "double_blocks_0_img_attn_qkv": (d, 3 * d), "double_blocks_0_img_attn_proj": (d, d),
        "double_blocks_0_txt_attn_proj": (d, d), "double_blocks_0_img_mlp_0": (d, 4 * d),
        "double_blocks_0_img_mlp_2": (4 * d, d), "single_blocks_0_linear2": (5 * d, d),
    }
    generator = torch.Generator("cpu").manual_seed(1000 + seed)
    state: dict[str, torch.Tensor] = {}
    for module, (fan_in, fan_out) in targets.items():
        key = f"lora_unet_{module}"
        state[f"{key}.lora_down.weight"] = torch.randn(rank, fan_in, generator=generator) * 0.3
        state[f"{key}.lora_up.weight"] = torch.randn(fan_out, rank, generator=generator) * 0.3
        state[f"{key}.alpha"] = torch.tensor(alpha)
    if text_encoder:
        state |= random_clip_lora("lora_te1", WIDTH, 37, (0, 1), generator, rank, alpha)
    (Path(models_dir) / "loras").mkdir(parents=True, exist_ok=True)
    save_file(state, Path(models_dir) / "loras" / name)
    return name
