"""A tiny random-weight Wan stack, laid out as studios have Wan (`./farm models smoke`, tests).
The same seed always builds the same weights. What `write_smoke_stack` writes:

    diffusion_models/smoke-wan.safetensors       T2V (Wan 2.1; Wan 2.2's high-noise expert):
                                                 `model.diffusion_model.` + the original keys
                                                 ComfyUI ships (+ .config.json)
    diffusion_models/smoke-wan-low.safetensors   Wan 2.2's low-noise expert (T2V, other weights),
                                                 diffusers' names (as the I2V one)
    diffusion_models/smoke-wan-i2v.safetensors   I2V / first-last frame: 36 input channels
                                                 (latents + mask + encoded condition video)
    diffusion_models/smoke-wan22-ti2v.safetensors  TI2V-5B: 48 channels in and out, per-token
                                                 timesteps (text or image to video, one model)
    vae/smoke-wan-vae.safetensors                AutoencoderKLWan, diffusers' keys (+ .config.json)
    vae/smoke-wan22-vae.safetensors              the Wan 2.2 VAE (TI2V-5B's: 48 channels, 2×2
                                                 pixel patches, ÷16), diffusers' keys (+ config)
    text_encoders/smoke-wan-umt5.safetensors     UMT5 encoder in its checkpoint keys
                                                 (+ .config.json, .tokenizer/)

Sizes follow diffusers' own Wan tests (tests/pipelines/wan/): 2 blocks of 2 heads of 12, text
width 32, a 2-layer UMT5 of width 32, the VAE at base width 3 with Wan's geometry (16 latent
channels, ÷8 in space, ÷4 in time; the 2.2 VAE at base width 12, residual, 48 channels, ÷16).
The tokenizer is byte-level with T5's `</s>` appended and
`<pad>` (no download).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from workers.models.wan import DIFFUSION_PREFIX, I2V_CHANNELS, T2V_CHANNELS, TI2V_CHANNELS, keys

SMOKE = "smoke-wan"
TEXT_WIDTH = 32  # UMT5's d_model == the transformer's text_dim


def transformer_config(in_channels: int = T2V_CHANNELS) -> dict[str, Any]:
    out = TI2V_CHANNELS if in_channels == TI2V_CHANNELS else T2V_CHANNELS
    return {"patch_size": [1, 2, 2], "num_attention_heads": 2, "attention_head_dim": 12,
            "in_channels": in_channels, "out_channels": out, "text_dim": TEXT_WIDTH,
            "freq_dim": 256, "ffn_dim": 32, "num_layers": 2, "cross_attn_norm": True,
            "qk_norm": "rms_norm_across_heads", "rope_max_seq_len": 32}


VAE_CONFIG: dict[str, Any] = {"base_dim": 3, "z_dim": 16, "dim_mult": [1, 1, 1, 1],
                              "num_res_blocks": 1, "temperal_downsample": [False, True, True]}
# The Wan 2.2 VAE's geometry (diffusers' Wan2.2-TI2V-5B vae/config.json: residual blocks, 12 =
# 3 × 2 × 2 patched pixel channels, 48 latent channels, ÷16) at a tiny width; its latents' mean
# and std are made up (not 0 / 1) so the normalisation is exercised.
VAE22_CONFIG: dict[str, Any] = {
    "base_dim": 12, "decoder_base_dim": 12, "z_dim": TI2V_CHANNELS, "in_channels": 12,
    "out_channels": 12, "is_residual": True, "patch_size": 2, "scale_factor_spatial": 16,
    "scale_factor_temporal": 4, "dim_mult": [1, 1, 1, 1], "num_res_blocks": 1,
    "temperal_downsample": [False, True, True],
    "latents_mean": [round(0.02 * (i % 7) - 0.06, 4) for i in range(TI2V_CHANNELS)],
    "latents_std": [round(0.8 + 0.05 * (i % 5), 4) for i in range(TI2V_CHANNELS)]}


def tiny_tokenizer() -> Any:
    """A byte-level fast tokenizer (256 byte tokens, then `<pad>`, `</s>`, `<unk>`) that ends
    every text with `</s>` as T5's does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {ch: i for i, ch in enumerate(bytes_to_unicode().values())}
    n = len(vocab)
    vocab.update({"<pad>": n, "</s>": n + 1, "<unk>": n + 2})
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.post_processor = processors.TemplateProcessing(single="$A </s>",
                                                      special_tokens=[("</s>", n + 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="</s>",
                                   unk_token="<unk>")


def text_encoder_config(tokenizer: Any) -> Any:
    from transformers import UMT5Config

    return UMT5Config(vocab_size=len(tokenizer), d_model=TEXT_WIDTH, d_kv=8, d_ff=32,
                      num_layers=2, num_heads=4, relative_attention_num_buckets=8,
                      pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                      decoder_start_token_id=tokenizer.pad_token_id)


def scheduler() -> Any:
    """The pipelines' scheduler as the farm's `sample` schedules Wan (its default shift)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    from workers.models.wan.engine import SHIFT

    return FlowMatchEulerDiscreteScheduler(shift=SHIFT)


def build_tiny_components(seed: int = 0) -> dict[str, Any]:
    """Fresh random modules (float32, CPU, eval): WanPipeline's component names, plus
    `transformer_low` (Wan 2.2's low-noise expert), `transformer_i2v` (36 channels),
    `transformer_ti2v` (TI2V-5B's 48) and `vae_22` (its Wan 2.2 VAE)."""
    from diffusers import AutoencoderKLWan, WanTransformer3DModel
    from transformers import UMT5EncoderModel

    tokenizer = tiny_tokenizer()
    torch.manual_seed(seed)
    parts: dict[str, Any] = {
        "transformer": WanTransformer3DModel(**transformer_config()),
        "vae": AutoencoderKLWan(**VAE_CONFIG),
        "text_encoder": UMT5EncoderModel(text_encoder_config(tokenizer)),
        "transformer_low": WanTransformer3DModel(**transformer_config()),
        "transformer_i2v": WanTransformer3DModel(**transformer_config(I2V_CHANNELS)),
        "transformer_ti2v": WanTransformer3DModel(**transformer_config(TI2V_CHANNELS)),
        "vae_22": AutoencoderKLWan(**VAE22_CONFIG),
    }
    return {**{k: v.eval() for k, v in parts.items()}, "tokenizer": tokenizer,
            "scheduler": scheduler()}


NAMES = {"model": f"{SMOKE}.safetensors", "model_low": f"{SMOKE}-low.safetensors",
         "model_i2v": f"{SMOKE}-i2v.safetensors", "vae": f"{SMOKE}-vae.safetensors",
         "model_ti2v": f"{SMOKE}22-ti2v.safetensors", "vae_22": f"{SMOKE}22-vae.safetensors",
         "text_encoder": f"{SMOKE}-umt5.safetensors"}


def write_smoke_stack(models_dir: Path, seed: int = 0) -> dict[str, str]:
    """Write the tiny stack under `models_dir`; the file name per role (NAMES)."""
    from safetensors.torch import save_file

    parts = build_tiny_components(seed)
    models_dir = Path(models_dir)
    for folder in ("diffusion_models", "vae", "text_encoders"):
        (models_dir / folder).mkdir(parents=True, exist_ok=True)
    for role, part in (("model", "transformer"), ("model_low", "transformer_low"),
                       ("model_i2v", "transformer_i2v"), ("model_ti2v", "transformer_ti2v")):
        path = models_dir / "diffusion_models" / NAMES[role]
        module = parts[part]
        state = dict(module.state_dict())
        if role == "model":  # ComfyUI's original layout; the others in diffusers' names
            state = keys.to_original(state)
        save_file({DIFFUSION_PREFIX + k: v.contiguous() for k, v in state.items()}, path)
        _config(path, "WanTransformer3DModel", dict(module.config))
    for role, part in (("vae", "vae"), ("vae_22", "vae_22")):
        vae = models_dir / "vae" / NAMES[role]
        save_file({k: v.contiguous() for k, v in parts[part].state_dict().items()}, vae)
        _config(vae, "AutoencoderKLWan", dict(parts[part].config))
    _single_file_encoder(parts["text_encoder"], parts["tokenizer"],
                         models_dir / "text_encoders" / NAMES["text_encoder"])
    return dict(NAMES)


def smoke_pipeline(seed: int = 0, *, experts: bool = False, i2v: bool = False,
                   ti2v: bool = False, boundary_ratio: float = 0.5) -> Any:
    """The reference pipeline built from the same in-memory tiny modules `write_smoke_stack`
    saves: WanPipeline (T2V), with `experts` Wan 2.2's two (transformer_2 + boundary_ratio);
    with `i2v` WanImageToVideoPipeline over the 36-channel transformer (no image encoder, as
    Wan 2.2 A14B I2V); with `ti2v` TI2V-5B's (the 48-channel transformer, the Wan 2.2 VAE,
    `expand_timesteps`): WanPipeline, or with `i2v` too WanImageToVideoPipeline."""
    from diffusers import WanImageToVideoPipeline, WanPipeline

    parts = build_tiny_components(seed)
    common = {k: parts[k] for k in ("tokenizer", "text_encoder", "vae", "scheduler")}
    pipe: Any
    if ti2v:
        common["vae"] = parts["vae_22"]
        if i2v:
            pipe = WanImageToVideoPipeline(transformer=parts["transformer_ti2v"],
                                           image_encoder=None, image_processor=None,
                                           expand_timesteps=True, **common)
        else:
            pipe = WanPipeline(transformer=parts["transformer_ti2v"], expand_timesteps=True,
                               **common)
    elif i2v:
        pipe = WanImageToVideoPipeline(transformer=parts["transformer_i2v"], image_encoder=None,
                                       image_processor=None, **common)
    elif experts:
        pipe = WanPipeline(transformer=parts["transformer"], transformer_2=parts["transformer_low"],
                           boundary_ratio=boundary_ratio, **common)
    else:
        pipe = WanPipeline(transformer=parts["transformer"], **common)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def write_tiny_lora(models_dir: Path, name: str = f"{SMOKE}-lora.safetensors", seed: int = 0,
                    rank: int = 4, alpha: float = 2.0) -> str:
    """A random LoRA of the tiny T2V transformer in ComfyUI's (original Wan) keys
    (`diffusion_model.blocks.0.self_attn.q.lora_A.weight`, `.lora_B.weight`, `.alpha`), as Wan
    trainers publish them, under `loras/<name>`; returns the name."""
    from workers.models.lora import random_lora, save_lora

    config = transformer_config()
    d = config["num_attention_heads"] * config["attention_head_dim"]
    targets = {"blocks.0.self_attn.q": (d, d), "blocks.0.cross_attn.o": (d, d),
               "blocks.1.ffn.0": (d, config["ffn_dim"]), "blocks.1.ffn.2": (config["ffn_dim"], d)}
    generator = torch.Generator("cpu").manual_seed(4000 + seed)
    state = random_lora(targets, generator, prefix="diffusion_model.", alpha=alpha, rank=rank)
    return save_lora(models_dir, name, state)


def _single_file_encoder(model: Any, tokenizer: Any, path: Path) -> None:
    """`<stem>.safetensors` + `<stem>.config.json` + `<stem>.tokenizer/`, as ComfyUI users keep
    text encoders (transformers' own save: the checkpoint's key layout)."""
    stem = path.name.removesuffix(".safetensors")
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        shutil.copy(Path(folder) / "model.safetensors", path)
        shutil.copy(Path(folder) / "config.json", path.with_name(f"{stem}.config.json"))
    tokenizer.save_pretrained(path.with_name(f"{stem}.tokenizer"))


def _config(path: Path, class_name: str, config: dict[str, Any]) -> None:
    stem = path.name.removesuffix(".safetensors")
    clean = {k: (list(v) if isinstance(v, tuple) else v) for k, v in config.items()
             if not k.startswith("_")}
    path.with_name(f"{stem}.config.json").write_text(
        json.dumps({"_class_name": class_name, **clean}, indent=2) + "\n")
