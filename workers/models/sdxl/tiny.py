"""A tiny random-weight SDXL checkpoint, laid out as studios have SDXL (`./farm models smoke`,
tests). The same seed always builds the same weights. What `write_smoke_stack` writes:

    checkpoints/smoke-sdxl.safetensors     one all-in-one file, the original key layout
                                           (model.diffusion_model.*, conditioner.embedders.0/1.*,
                                           first_stage_model.*; + `v_pred` when v-prediction)
    checkpoints/smoke-sdxl.diffusers/      its configs and tokenizers, laid out as a diffusers
                                           SDXL folder without weights (a real checkpoint uses
                                           the full-size ones shipped in configs/)

Sizes follow diffusers' own SDXL tests (tests/pipelines/stable_diffusion_xl/): a two-level UNet
(32, 64 channels, 2 layers per level, text_time embedding of 8 per size number), text encoders of
width 32 (CLIP-L) and 48 (bigG, projection 40: the two differ as full-size ones do, so the
converter tells them apart); the VAE has 4 blocks (÷8) as SDXL's. The tokenizers are CLIP's
byte-level alphabet without merges (no download); both pad to 77.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from workers.models.sdxl import V_PRED, keys

SMOKE = "smoke-sdxl"
CLIP_L_WIDTH, BIG_G_WIDTH, POOLED = 32, 48, 40
TIME_DIM = 8
UNET_CONFIG: dict[str, Any] = {
    "block_out_channels": [32, 64], "layers_per_block": 2, "sample_size": 32,
    "in_channels": 4, "out_channels": 4,
    "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D"],
    "up_block_types": ["CrossAttnUpBlock2D", "UpBlock2D"],
    "attention_head_dim": [2, 4], "use_linear_projection": True,
    "addition_embed_type": "text_time", "addition_time_embed_dim": TIME_DIM,
    "transformer_layers_per_block": [1, 2],
    "projection_class_embeddings_input_dim": 6 * TIME_DIM + POOLED,
    "cross_attention_dim": CLIP_L_WIDTH + BIG_G_WIDTH, "norm_num_groups": 32,
}
VAE_CONFIG: dict[str, Any] = {
    "in_channels": 3, "out_channels": 3, "latent_channels": 4,
    "down_block_types": ["DownEncoderBlock2D"] * 4, "up_block_types": ["UpDecoderBlock2D"] * 4,
    "block_out_channels": [32, 32, 32, 32], "layers_per_block": 1, "norm_num_groups": 32,
    "sample_size": 128, "scaling_factor": 0.13025, "force_upcast": True,
}


def clip_config(width: int, projection: int, vocab: int) -> Any:
    from transformers import CLIPTextConfig

    return CLIPTextConfig(
        hidden_size=width, intermediate_size=37, num_attention_heads=4, num_hidden_layers=5,
        vocab_size=vocab, max_position_embeddings=77, projection_dim=projection,
        hidden_act="gelu", layer_norm_eps=1e-5, bos_token_id=0, eos_token_id=2, pad_token_id=1)


def tiny_tokenizer(folder: Path, pad_token: str | None = None) -> Any:
    """A CLIPTokenizer over CLIP's byte alphabet (each byte, each byte ending a word, the two
    specials) with no merges, written to `folder`."""
    from transformers import CLIPTokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    alphabet = list(bytes_to_unicode().values())
    vocab = [*alphabet, *(c + "</w>" for c in alphabet), "<|startoftext|>", "<|endoftext|>"]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(vocab)}))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    tok: Any = CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"),
                             pad_token=pad_token or "<|endoftext|>")
    tok.model_max_length = 77
    tok.save_pretrained(folder)
    return tok


def build_tiny_components(seed: int = 0, v_pred: bool = False,
                          tokenizers: Path | None = None) -> dict[str, Any]:
    """Fresh random modules (float32, CPU, eval) under StableDiffusionXLPipeline's component
    names; the tokenizers are written under `tokenizers` (when given)."""
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    from workers.models.sdxl.engine import scheduler_config

    with tempfile.TemporaryDirectory(prefix="sdxl-tokenizers-") as scratch:
        folder = tokenizers or Path(scratch)  # the tokenizers live in memory once made
        tok = tiny_tokenizer(folder / "tokenizer")
        tok_2 = tiny_tokenizer(folder / "tokenizer_2", "!")
    torch.manual_seed(seed)
    unet: Any = UNet2DConditionModel(**UNET_CONFIG)
    vae: Any = AutoencoderKL(**VAE_CONFIG)
    clip_l = CLIPTextModel(clip_config(CLIP_L_WIDTH, CLIP_L_WIDTH, len(tok)))
    big_g = CLIPTextModelWithProjection(clip_config(BIG_G_WIDTH, POOLED, len(tok)))
    scheduler = EulerDiscreteScheduler.from_config(scheduler_config(v_pred))
    return {"unet": unet.eval(), "vae": vae.eval(), "text_encoder": clip_l.eval(),
            "text_encoder_2": big_g.eval(), "tokenizer": tok, "tokenizer_2": tok_2,
            "scheduler": scheduler}


def write_smoke_stack(models_dir: Path, seed: int = 0, v_pred: bool = False,
                      name: str = SMOKE) -> dict[str, str]:
    """Write the tiny checkpoint under `models_dir`; the file name per role: {"checkpoint"}."""
    from safetensors.torch import save_file

    folder = Path(models_dir) / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.safetensors"
    configs = folder / f"{name}.diffusers"
    parts = build_tiny_components(seed, v_pred, tokenizers=configs)
    state = keys.checkpoint(parts["unet"], parts["vae"], parts["text_encoder"],
                            parts["text_encoder_2"])
    if v_pred:
        state[V_PRED] = torch.tensor([])
    save_file(state, path)
    _configs(parts, configs)
    return {"checkpoint": path.name}


def smoke_pipeline(img2img: bool = False, seed: int = 0, v_pred: bool = False) -> Any:
    """The reference `StableDiffusionXLPipeline` (or `…Img2ImgPipeline`) built from the same
    in-memory tiny modules `write_smoke_stack(seed=seed, v_pred=v_pred)` saves."""
    from diffusers import StableDiffusionXLImg2ImgPipeline, StableDiffusionXLPipeline

    cls = StableDiffusionXLImg2ImgPipeline if img2img else StableDiffusionXLPipeline
    pipe: Any = cls(**build_tiny_components(seed, v_pred), add_watermarker=False)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _configs(parts: dict[str, Any], folder: Path) -> None:
    """The checkpoint's diffusers folder minus weights: model_index.json and each component's
    config (the tokenizers are already there)."""
    shipped = Path(__file__).parent / "configs" / "model_index.json"
    (folder / "model_index.json").write_text(shipped.read_text())
    for component in ("unet", "vae"):
        parts[component].save_config(folder / component)
    for component in ("text_encoder", "text_encoder_2"):
        parts[component].config.save_pretrained(folder / component)


def write_tiny_lora(models_dir: Path, name: str = f"{SMOKE}-lora.safetensors", seed: int = 0,
                    rank: int = 4, alpha: float = 2.0, text_encoders: bool = False,
                    locon: bool = False) -> str:
    """A random LoRA of the tiny UNet in kohya keys (the sgm UNet's names, as kohya's SDXL
    trainer writes them: `lora_unet_input_blocks_4_1_transformer_blocks_0_attn1_to_q.lora_down.
    weight`, `.lora_up.weight`, `.alpha`) under `loras/<name>`; returns the name. With
    `text_encoders`, CLIP-L's and bigG's halves too (`lora_te1_…`, `lora_te2_…`); with `locon`,
    kohya LoCon conv LoRAs on resnet convs too (`lora_unet_input_blocks_1_0_in_layers_2`: a down
    conv [r, in, 3, 3], an up conv [out, r, 1, 1]; a 1×1 skip connection)."""
    from safetensors.torch import save_file

    from workers.models.lora import random_clip_lora

    inner, cross = UNET_CONFIG["block_out_channels"][-1], CLIP_L_WIDTH + BIG_G_WIDTH
    block = "transformer_blocks_0"
    targets = {  # kohya module: (in, out)
        f"input_blocks_4_1_{block}_attn1_to_q": (inner, inner),
        f"input_blocks_4_1_{block}_attn2_to_k": (cross, inner),
        "input_blocks_4_1_proj_in": (inner, inner),
        "middle_block_1_transformer_blocks_1_ff_net_2": (4 * inner, inner),
        f"output_blocks_0_1_{block}_attn1_to_out_0": (inner, inner),
    }
    generator = torch.Generator("cpu").manual_seed(2000 + seed)
    state: dict[str, torch.Tensor] = {}
    for module, (fan_in, fan_out) in targets.items():
        key = f"lora_unet_{module}"
        state[f"{key}.lora_down.weight"] = torch.randn(rank, fan_in, generator=generator) * 0.3
        state[f"{key}.lora_up.weight"] = torch.randn(fan_out, rank, generator=generator) * 0.3
        state[f"{key}.alpha"] = torch.tensor(alpha)
    if locon:
        small, big = UNET_CONFIG["block_out_channels"]
        convs = {  # kohya module: (in, out, kernel)
            "input_blocks_1_0_in_layers_2": (small, small, 3),
            "input_blocks_4_0_out_layers_3": (big, big, 3),
            "middle_block_0_in_layers_2": (big, big, 3),
            "output_blocks_0_0_in_layers_2": (2 * big, big, 3),
            "output_blocks_0_0_skip_connection": (2 * big, big, 1),
        }
        for module, (fan_in, fan_out, k) in convs.items():
            key = f"lora_unet_{module}"
            state[f"{key}.lora_down.weight"] = torch.randn(rank, fan_in, k, k,
                                                           generator=generator) * 0.1
            state[f"{key}.lora_up.weight"] = torch.randn(fan_out, rank, 1, 1,
                                                         generator=generator) * 0.3
            state[f"{key}.alpha"] = torch.tensor(alpha)
    if text_encoders:
        for prefix, width in (("lora_te1", CLIP_L_WIDTH), ("lora_te2", BIG_G_WIDTH)):
            state |= random_clip_lora(prefix, width, 37, (0, 2), generator, rank, alpha)
    (Path(models_dir) / "loras").mkdir(parents=True, exist_ok=True)
    save_file(state, Path(models_dir) / "loras" / name)
    return name
