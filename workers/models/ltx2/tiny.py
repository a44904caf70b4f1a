"""A tiny random-weight LTX-2 stack (tests and `./farm models smoke`).
The same seed always builds the same weights.

Sizes follow diffusers' own LTX-2 tests (tests/pipelines/ltx2/test_ltx2.py): a 2-layer audio+video
transformer (video 2 heads of 8, audio 2 heads of 4, 4 latent channels each), 1-layer connectors,
a one-stage video VAE (÷2 in space, ÷2 in time: 5 frames → 3 latent frames), a 2-channel audio VAE
over 8 mel bins at 16 kHz and a vocoder upsampling 160× (the hop: the sound lasts the clip).
Diffusers' tests download `hf-internal-testing/tiny-gemma3`; here the Gemma3 (2 layers of width
32, a 1-layer vision tower) is built from a config and the tokenizer is byte-level (no download).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

WIDTH = 32  # Gemma3's hidden size == the transformer's caption_channels
LAYERS = 2  # Gemma3 text layers: the connectors read LAYERS + 1 stacked hidden states


def tiny_tokenizer() -> Any:
    """A byte-level tokenizer (256 byte tokens) with an end and a pad token."""
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {ch: i for i, ch in enumerate(bytes_to_unicode().values())}
    specials: dict[str, Any] = {"unk_token": None, "bos_token": None}
    tok: Any = Qwen2Tokenizer(vocab=vocab, merges=[], eos_token="<eos>", pad_token="<pad>", **specials)
    tok.padding_side = "left"  # Gemma's, as LTX2Pipeline sets it
    return tok


def text_encoder_config(tokenizer: Any) -> Any:
    from transformers import Gemma3Config

    return Gemma3Config(
        text_config={
            "hidden_size": WIDTH,
            "intermediate_size": 32,
            "num_hidden_layers": LAYERS,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 8,
            "vocab_size": len(tokenizer),
            "max_position_embeddings": 64,  # the farm encodes prompts to 64 tokens (its max)
            "sliding_window": 64,
            "pad_token_id": tokenizer.pad_token_id,
        },
        vision_config={
            "hidden_size": 16,
            "intermediate_size": 16,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": 16,
            "patch_size": 8,
        },
        mm_tokens_per_image=4,
        image_token_index=len(tokenizer) - 1,
    )


def gemma4_config(tokenizer: Any) -> Any:
    """LTX-2.5's text encoder at the tiny Gemma3's sizes: a Gemma 4 "unified" (text only; the
    12B that LTX-2.5 ships has no vision or audio tower either), one sliding and one global
    layer, the global one with V from K as the 12B has it."""
    from transformers import Gemma4UnifiedConfig

    return Gemma4UnifiedConfig(
        text_config={
            "hidden_size": WIDTH,
            "intermediate_size": 32,
            "num_hidden_layers": LAYERS,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 8,
            "global_head_dim": 8,
            "attention_k_eq_v": True,
            "num_global_key_value_heads": 1,
            "layer_types": ["sliding_attention", "full_attention"],
            "hidden_size_per_layer_input": 0,
            "num_kv_shared_layers": 0,
            "vocab_size": len(tokenizer),
            "max_position_embeddings": 64,
            "sliding_window": 64,
            "pad_token_id": tokenizer.pad_token_id,
        },
        vision_config=None,
        audio_config=None,
    )


# LTX-2.3's layout (diffusers' LTX-2.3 configs): gated attention and prompt AdaLN in the
# transformer, which takes the connectors' embeds as they are; a projection of Gemma's layers per
# modality and gated attention in the connectors
LTX23_TRANSFORMER = {"gated_attn": True, "cross_attn_mod": True, "audio_gated_attn": True,
                     "audio_cross_attn_mod": True, "use_prompt_embeddings": False}
LTX23_CONNECTORS = {"per_modality_projections": True, "video_hidden_dim": 16,
                    "audio_hidden_dim": 8, "video_gated_attn": True, "audio_gated_attn": True,
                    "proj_bias": True, "audio_connector_num_attention_heads": 2,
                    "audio_connector_attention_head_dim": 4, "video_connector_num_attention_heads": 2}
# LTX-2.5's transformer (diffusers' LTX2VideoTransformer3DModel docs): 2.3's, with no bias in the
# video feed-forward, a fixed per-layer prompt modulation (no prompt AdaLN) and an embedding for
# keyframe tokens; its connectors are 2.3's; its text encoder a Gemma 4 (`gemma4_config`)
LTX25_TRANSFORMER = {**LTX23_TRANSFORMER, "ff_bias": False, "use_prompt_adaln_single": False,
                     "use_keyframes_abs_pos_embedding": True}


def build_tiny_components(seed: int = 0, ltx23: bool = False, ltx25: bool = False
                          ) -> dict[str, Any]:
    """Fresh random modules (float32, CPU, eval) under LTX2Pipeline's component names;
    `ltx23`: in LTX-2.3's layout (its connectors at the transformer's widths, 16 and 8);
    `ltx25`: in LTX-2.5's (2.3's connectors, `LTX25_TRANSFORMER`, a Gemma 4 text encoder)."""
    from diffusers import (
        AutoencoderKLLTX2Audio,
        AutoencoderKLLTX2Video,
        FlowMatchEulerDiscreteScheduler,
        LTX2VideoTransformer3DModel,
    )
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder
    from transformers import Gemma3ForConditionalGeneration, Gemma4UnifiedForConditionalGeneration

    tokenizer = tiny_tokenizer()
    torch.manual_seed(seed)
    text_encoder: Any = (Gemma4UnifiedForConditionalGeneration(gemma4_config(tokenizer)) if ltx25
                         else Gemma3ForConditionalGeneration(text_encoder_config(tokenizer)))
    layout = LTX25_TRANSFORMER if ltx25 else LTX23_TRANSFORMER if ltx23 else {}
    torch.manual_seed(seed)
    transformer: Any = LTX2VideoTransformer3DModel(
        in_channels=4,
        out_channels=4,
        patch_size=1,
        patch_size_t=1,
        num_attention_heads=2,
        attention_head_dim=8,
        cross_attention_dim=16,
        audio_in_channels=4,
        audio_out_channels=4,
        audio_num_attention_heads=2,
        audio_attention_head_dim=4,
        audio_cross_attention_dim=8,
        num_layers=2,
        qk_norm="rms_norm_across_heads",
        caption_channels=WIDTH,
        rope_double_precision=False,
        rope_type="split",
        **layout,
    )
    torch.manual_seed(seed)
    connector_config: dict[str, Any] = dict(
        caption_channels=WIDTH,
        text_proj_in_factor=LAYERS + 1,
        video_connector_num_attention_heads=4,
        video_connector_attention_head_dim=8,
        video_connector_num_layers=1,
        video_connector_num_learnable_registers=None,
        audio_connector_num_attention_heads=4,
        audio_connector_attention_head_dim=8,
        audio_connector_num_layers=1,
        audio_connector_num_learnable_registers=None,
        connector_rope_base_seq_len=32,
        rope_theta=10000.0,
        rope_double_precision=False,
        causal_temporal_positioning=False,
        rope_type="split",
    )
    connectors: Any = LTX2TextConnectors(**{**connector_config,
                                            **(LTX23_CONNECTORS if ltx23 or ltx25 else {})})
    torch.manual_seed(seed)
    vae: Any = AutoencoderKLLTX2Video(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        block_out_channels=(8,),
        decoder_block_out_channels=(8,),
        layers_per_block=(1,),
        decoder_layers_per_block=(1, 1),
        spatio_temporal_scaling=(True,),
        decoder_spatio_temporal_scaling=(True,),
        decoder_inject_noise=(False, False),
        downsample_type=("spatial",),
        upsample_residual=(False,),
        upsample_factor=(1,),
        timestep_conditioning=False,
        patch_size=1,
        patch_size_t=1,
        encoder_causal=True,
        decoder_causal=False,
    )
    vae.use_framewise_encoding = False
    vae.use_framewise_decoding = False
    torch.manual_seed(seed)
    audio_vae: Any = AutoencoderKLLTX2Audio(
        base_channels=4,
        output_channels=2,
        ch_mult=(1, 2, 4),  # two downsamples: LTX-2's 4× in time and mel, as the transformer reads
        num_res_blocks=1,
        attn_resolutions=None,
        in_channels=2,
        resolution=32,
        latent_channels=2,
        norm_type="pixel",
        causality_axis="height",
        dropout=0.0,
        mid_block_add_attention=False,
        sample_rate=16000,
        mel_hop_length=160,
        is_causal=True,
        mel_bins=8,
    )
    torch.manual_seed(seed)
    vocoder: Any = LTX2Vocoder(
        in_channels=2 * 8,
        hidden_channels=32,
        out_channels=2,
        upsample_kernel_sizes=[16, 10, 8],
        upsample_factors=[8, 5, 4],  # 160×: the audio VAE's hop, so the sound lasts the clip
        resnet_kernel_sizes=[3],
        resnet_dilations=[[1, 3, 5]],
        leaky_relu_negative_slope=0.1,
        output_sampling_rate=16000,
    )
    return {
        "transformer": transformer.eval(),
        "vae": vae.eval(),
        "audio_vae": audio_vae.eval(),
        "scheduler": FlowMatchEulerDiscreteScheduler(),
        "text_encoder": text_encoder.eval(),
        "tokenizer": tokenizer,
        "connectors": connectors.eval(),
        "vocoder": vocoder.eval(),
    }


SMOKE = "smoke-ltx2"


def write_tiny_stack(models_dir: Path) -> dict[str, str]:
    """`checkpoints/smoke-ltx2/`: the tiny stack as a diffusers LTX2Pipeline folder (safetensors);
    returns {"checkpoint": "smoke-ltx2"}."""
    from diffusers import LTX2Pipeline

    pipe: Any = LTX2Pipeline(**build_tiny_components())
    pipe.save_pretrained(models_dir / "checkpoints" / SMOKE, safe_serialization=True)
    return {"checkpoint": SMOKE}


SMOKE_FILE = "smoke-ltx2-file"


def write_tiny_single_file(models_dir: Path, name: str = SMOKE_FILE, ltx23: bool = False
                           ) -> dict[str, str]:
    """The same tiny stack as ComfyUI keeps LTX-2: `checkpoints/<name>.safetensors`, the
    all-in-one file in the original keys (keys.to_original), and `checkpoints/<name>.diffusers/`
    beside it (the pipeline folder's configs, scheduler, tokenizer and Gemma 3, without the
    file's five components' weights; `ltx23`: LTX-2.3's layout and configs); returns
    {"checkpoint": "<name>.safetensors"}."""
    from diffusers import LTX2Pipeline
    from safetensors.torch import save_file

    from workers.models.ltx2 import keys
    from workers.models.ltx2.loading import FROM_FILE

    folder = models_dir / "checkpoints"
    components = build_tiny_components(ltx23=ltx23)
    configs = folder / f"{name}.diffusers"
    pipe: Any = LTX2Pipeline(**components)
    pipe.save_pretrained(configs, safe_serialization=True)
    for component in FROM_FILE:
        for weights in (configs / component).glob("*.safetensors"):
            weights.unlink()
    state = keys.to_original({c: components[c].state_dict() for c in FROM_FILE})
    save_file(state, str(folder / f"{name}.safetensors"))
    return {"checkpoint": f"{name}.safetensors"}


SMOKE_FILES = "smoke-ltx25"


def write_tiny_files(models_dir: Path, name: str = SMOKE_FILES, ltx23: bool = False,
                     ltx25: bool = True) -> dict[str, str]:
    """The tiny stack as ComfyUI's separate files (workers/models/ltx2/files.py; LTX-2.5's
    layout unless told otherwise): `diffusion_models/<name>.safetensors`,
    `vae/<name>-video-vae.safetensors`, `vae/<name>-audio-vae.safetensors`,
    `text_encoders/<name>-text-encoder.safetensors`, each with its `<stem>.diffusers/` configs;
    returns {role: file name}."""
    from safetensors.torch import save_file

    from workers.models.ltx2.files import FOLDERS, HOLDS, to_files

    components = build_tiny_components(ltx23=ltx23, ltx25=ltx25)
    stems = {"diffusion_model": name, "vae": f"{name}-video-vae",
             "audio_vae": f"{name}-audio-vae", "text_encoder": f"{name}-text-encoder"}
    names = {}
    for role, state in to_files(components).items():
        folder = models_dir / FOLDERS[role]
        configs = folder / f"{stems[role]}.diffusers"
        for component in (*HOLDS[role], *(("connectors",) if role == "text_encoder" else ())):
            module = components[component]
            if hasattr(module, "save_pretrained") and component != "text_encoder":
                module.save_pretrained(configs / component)
            else:  # a model: its config only (its weights are the file's)
                (module.save_config if hasattr(module, "save_config") else
                 module.config.save_pretrained)(configs / component)
            for weights in (configs / component).glob("*.safetensors"):
                weights.unlink()
        names[role] = f"{stems[role]}.safetensors"
        save_file(state, str(folder / names[role]))
    return names


SMOKE_UPSAMPLER = "smoke-ltx2-upscaler.safetensors"
UPSAMPLER_CONFIG = {"in_channels": 4, "mid_channels": 32, "num_blocks_per_stage": 1, "dims": 3,
                    "spatial_upsample": True, "temporal_upsample": False,
                    "use_rational_resampler": False}  # Lightricks' x2: conv + pixel shuffle


def build_tiny_upsampler(seed: int = 0) -> Any:
    """A random LTX2LatentUpsamplerModel over the tiny VAE's 4 latent channels (diffusers'
    own tests' size: 32 channels, one block a stage), ×2 in space."""
    from diffusers.pipelines.ltx2.latent_upsampler import LTX2LatentUpsamplerModel

    torch.manual_seed(seed)
    return LTX2LatentUpsamplerModel(**UPSAMPLER_CONFIG).eval()


def write_tiny_upsampler(models_dir: Path, name: str = SMOKE_UPSAMPLER) -> dict[str, str]:
    """`latent_upscale_models/<name>` as Lightricks ships it: the net's tensors with its config
    in the file's `config` metadata; returns {"latent_upscaler": name}."""
    import json

    from safetensors.torch import save_file

    folder = models_dir / "latent_upscale_models"
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in build_tiny_upsampler().state_dict().items()}
    save_file(state, str(folder / name), metadata={"config": json.dumps(UPSAMPLER_CONFIG)})
    return {"latent_upscaler": name}


def write_tiny_lora(models_dir: Path, name: str = f"{SMOKE}-lora.safetensors", seed: int = 0,
                    rank: int = 4) -> str:
    """A random LoRA of the tiny transformer in ComfyUI's (Lightricks' original) keys
    (`diffusion_model.transformer_blocks.0.attn1.to_q.lora_A.weight`, `.lora_B.weight`; no
    `.alpha`, as Lightricks publishes them and as diffusers' LTX-2 reader wants) on video,
    audio and cross-modal layers, under `loras/<name>`; returns the name."""
    from workers.models.lora import random_lora, save_lora

    targets = {"transformer_blocks.0.attn1.to_q": (16, 16),  # video width 16, audio 8
               "transformer_blocks.0.audio_attn1.to_v": (8, 8),
               "transformer_blocks.1.audio_to_video_attn.to_q": (16, 8),
               "transformer_blocks.1.ff.net.2": (64, 16)}
    generator = torch.Generator("cpu").manual_seed(5000 + seed)
    state = random_lora(targets, generator, prefix="diffusion_model.", rank=rank)
    return save_lora(models_dir, name, state)


def write_tiny_gemma_lora(models_dir: Path, name: str = f"{SMOKE}-gemma-lora.safetensors",
                          seed: int = 0, rank: int = 4, alpha: float = 2.0) -> str:
    """A random LoRA of the tiny Gemma 3's attention and MLP in ComfyUI's text-encoder keys
    (`text_encoders.gemma3_12b.transformer.model.layers.0.self_attn.q_proj.lora_A.weight`,
    `.lora_B.weight`, `.alpha`; the shipped templates' abliterated Gemma LoRA is of this kind)
    under `loras/<name>`; returns the name."""
    from workers.models.lora import random_lora, save_lora
    from workers.models.ltx2 import GEMMA_LORA_PREFIX

    targets = {"layers.0.self_attn.q_proj": (32, 16), "layers.0.self_attn.v_proj": (32, 8),
               "layers.1.self_attn.o_proj": (16, 32), "layers.1.mlp.down_proj": (32, 32)}
    generator = torch.Generator("cpu").manual_seed(6000 + seed)
    state = random_lora(targets, generator, prefix=GEMMA_LORA_PREFIX, scale=1.0, alpha=alpha,
                        rank=rank)
    return save_lora(models_dir, name, state)
