"""A tiny random-weight Z-Image stack, written in the ComfyUI models-dir layout.

For `./farm models smoke` (exercise the whole farm without real weights) and for tests. The
same seed always builds the same weights. What `write_smoke_stack` writes:

    diffusion_models/<name>.safetensors   original / ComfyUI keys (model.diffusion_model., fused qkv)
    diffusion_models/<name>.config.json   its diffusers config (the sidecar convention)
    vae/<name>.safetensors                diffusers keys, + vae/<name>.config.json
                                          (`to_original_flux_vae_keys` gives Flux's `ae` layout)
    text_encoders/<name>/                 a transformers folder: config, weights, tokenizer

Geometry (the constraints FACTS.md lists): transformer per diffusers' own test config but with
full-size axes_lens (so a 512-token caption and 4096-px sides fit); Flux-geometry VAE (16 latent
channels, ÷8, scaling 0.3611 / shift 0.1159); a 2-layer Qwen3 with hidden size == cap_feat_dim;
a byte-level Qwen2 tokenizer with a Qwen3-style chat template and a pad token (no merges, no
download).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch

SMOKE_NAME = "zimage-SMOKE-random-weights"
HIDDEN = 16  # text encoder hidden size == transformer cap_feat_dim

TRANSFORMER_CONFIG: dict[str, Any] = {
    "all_patch_size": [2],
    "all_f_patch_size": [1],
    "in_channels": 16,
    "dim": 32,
    "n_layers": 2,
    "n_refiner_layers": 1,
    "n_heads": 2,
    "n_kv_heads": 2,
    "norm_eps": 1e-5,
    "qk_norm": True,
    "cap_feat_dim": HIDDEN,
    "rope_theta": 256.0,
    "t_scale": 1000.0,
    "axes_dims": [8, 4, 4],
    "axes_lens": [1536, 512, 512],
}
VAE_CONFIG: dict[str, Any] = {
    "in_channels": 3,
    "out_channels": 3,
    "latent_channels": 16,
    "down_block_types": ["DownEncoderBlock2D"] * 4,
    "up_block_types": ["UpDecoderBlock2D"] * 4,
    "block_out_channels": [32, 32, 32, 32],
    "layers_per_block": 1,
    "norm_num_groups": 32,
    "sample_size": 64,
    "scaling_factor": 0.3611,
    "shift_factor": 0.1159,
    "use_quant_conv": False,
    "use_post_quant_conv": False,
    "force_upcast": True,
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
    # unk/bos None: a byte-level vocab has no unknowns (the stubs want str, the code allows None)
    specials: dict[str, Any] = {"unk_token": None, "bos_token": None}
    tok: Any = Qwen2Tokenizer(
        vocab=vocab, merges=[], eos_token="<|im_end|>", pad_token="<|endoftext|>", **specials
    )
    tok.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS)})
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_tiny_components(seed: int = 0) -> dict[str, Any]:
    """Fresh random modules (float32, CPU, eval): transformer, vae, text_encoder, tokenizer,
    scheduler. The same seed builds the same weights."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, ZImageTransformer2DModel
    from transformers import Qwen3Config, Qwen3Model

    from workers.models.zimage.engine import scheduler_config

    tokenizer = tiny_tokenizer()
    torch.manual_seed(seed)
    transformer: Any = ZImageTransformer2DModel(**TRANSFORMER_CONFIG)
    vae: Any = AutoencoderKL(**VAE_CONFIG)
    te_config = Qwen3Config(
        hidden_size=HIDDEN,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
        vocab_size=len(tokenizer),
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
    )
    te_config._attn_implementation = "sdpa"  # what from_pretrained picks when reloading
    text_encoder = Qwen3Model(te_config).eval()
    scheduler = FlowMatchEulerDiscreteScheduler.from_config(scheduler_config())
    return {
        "transformer": transformer.eval(),
        "vae": vae.eval(),
        "text_encoder": text_encoder,
        "tokenizer": tokenizer,
        "scheduler": scheduler,
    }


def to_comfy_transformer_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Diffusers Z-Image transformer keys → the original / ComfyUI layout.

    The inverse of diffusers' `convert_z_image_transformer_checkpoint_to_diffusers`: fuse
    to_q/to_k/to_v into `qkv` (concatenated on dim 0), rename the rest, add the prefix.
    """
    renames = (
        ("all_final_layer.2-1.", "final_layer."),
        ("all_x_embedder.2-1.", "x_embedder."),
        (".attention.to_out.0.", ".attention.out."),
        (".attention.norm_q.", ".attention.q_norm."),
        (".attention.norm_k.", ".attention.k_norm."),
    )
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if ".attention.to_k." in key or ".attention.to_v." in key:
            continue  # fused with to_q below
        if ".attention.to_q.weight" in key:
            parts = [state[key.replace("to_q", p)] for p in ("to_q", "to_k", "to_v")]
            key, value = key.replace("to_q.weight", "qkv.weight"), torch.cat(parts, dim=0)
        for old, new in renames:
            key = key.replace(old, new)
        out["model.diffusion_model." + key] = value.contiguous()
    return out


_VAE_ATTENTION_RENAMES = (
    ("group_norm.", "norm."),
    ("to_q.", "q."),
    ("to_k.", "k."),
    ("to_v.", "v."),
    ("to_out.0.", "proj_out."),
)


def to_original_flux_vae_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Diffusers AutoencoderKL keys → the original Flux `ae.safetensors` (LDM) layout.

    The exact inverse of diffusers' `convert_ldm_vae_checkpoint` (no `first_stage_model.`
    prefix, as Black Forest Labs / ComfyUI ship Flux's ae):
    `{en,de}coder.conv_norm_out` → `norm_out`; `encoder.down_blocks.i.resnets.j` →
    `encoder.down.i.block.j`, `.downsamplers.0` → `.downsample`; `decoder.up_blocks.i` →
    `decoder.up.(n-1-i)` (LDM numbers the decoder's blocks by resolution, as the encoder's:
    up.0 is the full-resolution block, which runs last), `.upsamplers.0` → `.upsample`; `conv_shortcut` →
    `nin_shortcut`; `mid_block.resnets.j` → `mid.block_(j+1)`; `mid_block.attentions.0` →
    `mid.attn_1` with group_norm/to_q/to_k/to_v/to_out.0 → norm/q/k/v/proj_out, whose linear
    [C, C] weights become the 1×1-conv [C, C, 1, 1] weights Flux's AttnBlock stores.
    """
    up_ids = [int(m[1]) for k in state if (m := re.match(r"decoder\.up_blocks\.(\d+)\.", k))]
    n_up = max(up_ids, default=-1) + 1

    def up(m: re.Match[str]) -> str:
        return f"decoder.up.{n_up - 1 - int(m[1])}.{'block' if m[2] == 'resnets' else 'upsample'}."

    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        new = re.sub(r"^(encoder|decoder)\.conv_norm_out\.", r"\1.norm_out.", key)
        new = re.sub(r"^encoder\.down_blocks\.(\d+)\.resnets\.", r"encoder.down.\1.block.", new)
        new = re.sub(r"^encoder\.down_blocks\.(\d+)\.downsamplers\.0\.", r"encoder.down.\1.downsample.", new)
        new = re.sub(r"^decoder\.up_blocks\.(\d+)\.(resnets|upsamplers\.0)\.", up, new)
        new = re.sub(r"\.mid_block\.resnets\.(\d+)\.", lambda m: f".mid.block_{int(m[1]) + 1}.", new)
        new = new.replace(".conv_shortcut.", ".nin_shortcut.")
        if ".mid_block.attentions.0." in new:
            head, tail = new.split(".mid_block.attentions.0.")
            for old, renamed in _VAE_ATTENTION_RENAMES:
                if tail.startswith(old):
                    tail = renamed + tail[len(old) :]
            new = f"{head}.mid.attn_1.{tail}"
            if value.ndim == 2:  # q/k/v/proj_out weights: Linear → Conv2d 1×1
                value = value[:, :, None, None]
        out[new] = value.contiguous()
    return out


def write_smoke_stack(models_dir: Path, name: str = SMOKE_NAME, seed: int = 0) -> dict[str, str]:
    """Write the tiny stack under `models_dir`; returns the file name per zimage/turbo param:
    {"model": …, "vae": …, "text_encoder": …}. Overwrites a previous smoke stack."""
    from safetensors.torch import save_file

    parts = build_tiny_components(seed)
    models_dir = Path(models_dir)
    for folder in ("diffusion_models", "vae", "text_encoders"):
        (models_dir / folder).mkdir(parents=True, exist_ok=True)

    model_file = f"{name}.safetensors"
    state = to_comfy_transformer_keys(parts["transformer"].state_dict())
    save_file(state, models_dir / "diffusion_models" / model_file)
    _write_config(
        models_dir / "diffusion_models" / f"{name}.config.json",
        "ZImageTransformer2DModel",
        TRANSFORMER_CONFIG,
    )

    vae_state = {k: v.contiguous() for k, v in parts["vae"].state_dict().items()}
    save_file(vae_state, models_dir / "vae" / model_file)
    _write_config(models_dir / "vae" / f"{name}.config.json", "AutoencoderKL", VAE_CONFIG)

    te_dir = models_dir / "text_encoders" / name
    parts["text_encoder"].save_pretrained(te_dir)
    parts["tokenizer"].save_pretrained(te_dir)
    return {"model": model_file, "vae": model_file, "text_encoder": name}


def smoke_pipeline(img2img: bool = False, seed: int = 0) -> Any:
    """The reference diffusers pipeline (`ZImagePipeline`, or `ZImageImg2ImgPipeline`) built
    from the same in-memory tiny modules `write_smoke_stack(seed=seed)` saves."""
    from diffusers import ZImageImg2ImgPipeline, ZImagePipeline

    cls = ZImageImg2ImgPipeline if img2img else ZImagePipeline
    pipe: Any = cls(**build_tiny_components(seed))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _write_config(path: Path, class_name: str, config: dict[str, Any]) -> None:
    path.write_text(json.dumps({"_class_name": class_name, **config}, indent=2) + "\n")


def write_tiny_lora(models_dir: Path, name: str = "zimage-SMOKE-lora.safetensors", seed: int = 0,
                    rank: int = 4, alpha: float = 2.0) -> str:
    """A random LoRA of the tiny transformer in kohya keys (`lora_unet_layers_0_attention_to_q.
    lora_down.weight`, `.lora_up.weight`, `.alpha`), as Z-Image trainers publish them, under
    `loras/<name>`; returns the name."""
    from diffusers import ZImageTransformer2DModel
    from safetensors.torch import save_file

    with torch.device("meta"):
        model: Any = ZImageTransformer2DModel(**TRANSFORMER_CONFIG)
    modules = dict(model.named_modules())
    targets = ["layers.0.attention.to_q", "layers.1.attention.to_out.0",
               "layers.0.feed_forward.w2", "layers.1.adaLN_modulation.0",
               "noise_refiner.0.attention.to_k", "context_refiner.0.feed_forward.w1"]
    generator = torch.Generator("cpu").manual_seed(3000 + seed)
    state: dict[str, torch.Tensor] = {}
    for target in targets:
        linear = modules[target]
        key = "lora_unet_" + target.replace(".", "_")
        state[f"{key}.lora_down.weight"] = torch.randn(rank, linear.in_features,
                                                       generator=generator) * 0.3
        state[f"{key}.lora_up.weight"] = torch.randn(linear.out_features, rank,
                                                     generator=generator) * 0.3
        state[f"{key}.alpha"] = torch.tensor(alpha)
    (Path(models_dir) / "loras").mkdir(parents=True, exist_ok=True)
    save_file(state, Path(models_dir) / "loras" / name)
    return name
