"""A tiny random-weight Qwen-Image stack, laid out as studios have Qwen-Image (`./farm models
smoke`, tests). The same seed always builds the same weights. What `write_smoke_stack` writes:

    diffusion_models/smoke-qwenimage.safetensors   ComfyUI's keys: `model.diffusion_model.` +
                                                   diffusers' names (+ .config.json)
    vae/smoke-qwenimage-vae.safetensors            the original (Wan) keys ComfyUI ships
                                                   (`decoder.upsamples.N`) (+ .config.json)
    text_encoders/smoke-qwenimage-qwen25vl.safetensors
                                                   Qwen2.5-VL in its checkpoint keys (`model.layers`,
                                                   `visual.`) (+ .config.json, .tokenizer/)

Sizes follow diffusers' own Qwen-Image tests (tests/pipelines/qwenimage/): 2 blocks of 2 heads of
16 (rope axes 8+4+4), a 2-layer Qwen2.5-VL of width 16 (= joint_attention_dim) with a 2-block
vision tower; the VAE keeps Qwen-Image's geometry (16 latent channels, ÷8: 3 downsamples, 2 res
blocks per stage as the original layout has them) at width 16. The tokenizer is byte-level with
Qwen's chat and vision specials (no download).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from workers.models.qwenimage import DIFFUSION_PREFIX, LATENT, keys

SMOKE = "smoke-qwenimage"
WIDTH = 16  # the text encoder's hidden size == the transformer's joint_attention_dim
TRANSFORMER_CONFIG: dict[str, Any] = {
    "patch_size": 2, "in_channels": 4 * LATENT.channels, "out_channels": LATENT.channels,
    "num_layers": 2, "attention_head_dim": 16, "num_attention_heads": 2,
    "joint_attention_dim": WIDTH, "guidance_embeds": False, "axes_dims_rope": [8, 4, 4],
}
VAE_CONFIG: dict[str, Any] = {
    "base_dim": 16, "z_dim": LATENT.channels, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 2,
    "temperal_downsample": [False, True, True],
}
SPECIALS = ("<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>")


def tiny_tokenizer() -> Any:
    """A byte-level Qwen2Tokenizer (256 byte tokens) with Qwen's chat and vision specials and
    its pad token."""
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {ch: i for i, ch in enumerate(bytes_to_unicode().values())}
    specials: dict[str, Any] = {"unk_token": None, "bos_token": None}  # byte-level: no unknowns
    tok: Any = Qwen2Tokenizer(vocab=vocab, merges=[], eos_token="<|im_end|>",
                              pad_token="<|endoftext|>", **specials)
    tok.add_special_tokens({"additional_special_tokens": list(SPECIALS)})
    return tok


def text_encoder_config(tokenizer: Any) -> Any:
    from transformers import Qwen2_5_VLConfig

    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in (
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"),
        ("image_token_id", "<|image_pad|>"))}
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    return Qwen2_5_VLConfig(
        text_config={"hidden_size": WIDTH, "intermediate_size": 16, "num_hidden_layers": 2,
                     "num_attention_heads": 2, "num_key_value_heads": 2,
                     "rope_scaling": {"mrope_section": [1, 1, 2], "rope_type": "default",
                                      "type": "default"},
                     "rope_theta": 1000000.0, "vocab_size": len(tokenizer),
                     "bos_token_id": eos, "eos_token_id": eos, "pad_token_id": pad},
        vision_config={"depth": 2, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2,
                       "out_hidden_size": WIDTH},
        **ids)


def build_tiny_components(seed: int = 0, zero_cond_t: bool = False) -> dict[str, Any]:
    """Fresh random modules (float32, CPU, eval) under QwenImagePipeline's component names;
    `zero_cond_t`: the transformer's config as Qwen-Image-Edit-2511's (the same weights)."""
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImageTransformer2DModel,
    )
    from transformers import Qwen2_5_VLForConditionalGeneration

    from workers.models.qwenimage.engine import scheduler_config

    tokenizer = tiny_tokenizer()
    torch.manual_seed(seed)
    transformer: Any = QwenImageTransformer2DModel(**TRANSFORMER_CONFIG, zero_cond_t=zero_cond_t)
    vae: Any = AutoencoderKLQwenImage(**VAE_CONFIG)
    text_encoder: Any = Qwen2_5_VLForConditionalGeneration(text_encoder_config(tokenizer))
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
             "text_encoder": f"{SMOKE}-qwen25vl.safetensors"}
    transformer = models_dir / "diffusion_models" / names["model"]
    save_file({DIFFUSION_PREFIX + k: v.contiguous()
               for k, v in parts["transformer"].state_dict().items()}, transformer)
    _config(transformer, "QwenImageTransformer2DModel", TRANSFORMER_CONFIG)
    vae = models_dir / "vae" / names["vae"]
    save_file(keys.to_original(parts["vae"].state_dict()), vae)
    _config(vae, "AutoencoderKLQwenImage", VAE_CONFIG)
    _single_file_encoder(parts["text_encoder"], parts["tokenizer"],
                         models_dir / "text_encoders" / names["text_encoder"])
    return names


def smoke_pipeline(seed: int = 0) -> Any:
    """The reference `QwenImagePipeline` built from the same in-memory tiny modules
    `write_smoke_stack(seed=seed)` saves."""
    from diffusers import QwenImagePipeline

    pipe: Any = QwenImagePipeline(**build_tiny_components(seed))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _single_file_encoder(model: Any, tokenizer: Any, path: Path) -> None:
    """`<stem>.safetensors` + `<stem>.config.json` + `<stem>.tokenizer/`, as ComfyUI users keep
    text encoders (transformers' own save: the checkpoint's key layout)."""
    stem = path.name.removesuffix(".safetensors")
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        shutil.copy(Path(folder) / "model.safetensors", path)
        shutil.copy(Path(folder) / "config.json", path.with_name(f"{stem}.config.json"))
    tokenizer.save_pretrained(path.with_name(f"{stem}.tokenizer"))
    tiny_processor(tokenizer).save_pretrained(path.with_name(f"{stem}.tokenizer"))


def tiny_processor(tokenizer: Any) -> Any:
    """The Qwen2-VL processor of the tiny tokenizer (Qwen2-VL's image processor defaults:
    14-px patches merged 2×2, as the tiny vision tower reads them)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    from workers.models.qwenimage.vl import ImageTextProcessor

    return ImageTextProcessor(image_processor=Qwen2VLImageProcessorPil(), tokenizer=tokenizer)


def smoke_edit_pipeline(variant: str = "plus", seed: int = 0, zero_cond_t: bool = False) -> Any:
    """The reference `QwenImageEditPlusPipeline` (variant plus) or `QwenImageEditPipeline`
    (edit) built from the same in-memory tiny modules `write_smoke_stack(seed=seed)` saves;
    `zero_cond_t`: its transformer configured as Qwen-Image-Edit-2511's."""
    from diffusers import QwenImageEditPipeline, QwenImageEditPlusPipeline

    parts = build_tiny_components(seed, zero_cond_t=zero_cond_t)
    cls = QwenImageEditPlusPipeline if variant == "plus" else QwenImageEditPipeline
    pipe: Any = cls(processor=tiny_processor(parts["tokenizer"]), **parts)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _config(path: Path, class_name: str, config: dict[str, Any]) -> None:
    stem = path.name.removesuffix(".safetensors")
    path.with_name(f"{stem}.config.json").write_text(
        json.dumps({"_class_name": class_name, **config}, indent=2) + "\n")


def write_tiny_lora(models_dir: Path, name: str = f"{SMOKE}-lora.safetensors", seed: int = 0,
                    rank: int = 4, alpha: float = 2.0) -> str:
    """A random LoRA of the tiny transformer in ComfyUI / diffusers-PEFT keys
    (`diffusion_model.transformer_blocks.0.img_mlp.net.2.lora_A.weight`, `.lora_B.weight`,
    `.alpha`), as Qwen-Image trainers publish them, under `loras/<name>`; returns the name."""
    from workers.models.lora import random_lora, save_lora

    d = TRANSFORMER_CONFIG["num_attention_heads"] * TRANSFORMER_CONFIG["attention_head_dim"]
    targets = {  # module: (in, out)
        "transformer_blocks.0.attn.to_q": (d, d), "transformer_blocks.0.attn.to_out.0": (d, d),
        "transformer_blocks.0.img_mlp.net.0.proj": (d, 4 * d),
        "transformer_blocks.0.img_mlp.net.2": (4 * d, d),
        "transformer_blocks.1.txt_mlp.net.2": (4 * d, d),
    }
    generator = torch.Generator("cpu").manual_seed(3000 + seed)
    state = random_lora(targets, generator, prefix="diffusion_model.", alpha=alpha, rank=rank)
    return save_lora(models_dir, name, state)
