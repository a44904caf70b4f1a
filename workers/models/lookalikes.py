"""Marks that tell apart the files of families whose key names overlap. TORCH-FREE.

FLUX.2 kept FLUX.1's `double_blocks.*.img_attn` names and LoRA module names, so FLUX.1's
`recognise` must refuse FLUX.2's files; Qwen-Image 2.1 kept Qwen-Image's
`transformer_blocks.N.img_mlp`, so Qwen-Image's must refuse 2.1's LoRAs; Gemma has Qwen3's
per-head q_norm, so the Qwen3 readers must refuse LTX-2's Gemma. The families read these
marks from here (a family package never imports another's)."""

from __future__ import annotations

from workers.models.header import ModelHeader


def is_flux2_lora(header: ModelHeader) -> bool:
    """A LoRA of FLUX.2's transformer in diffusers / PEFT names: its modules FLUX.1 lacks (the
    single blocks' fused `to_qkv_mlp_proj`, the SwiGLU `linear_in` / `linear_out`)."""
    return any(header.has(f) for f in ("to_qkv_mlp_proj", "ff.linear_in", "ff.linear_out",
                                        "ff_context.linear_in", "ff_context.linear_out"))


def is_flux2_transformer(header: ModelHeader) -> bool:
    """A FLUX.2 transformer, in any layout (its shared `*_stream_modulation` layers)."""
    return header.class_name == "Flux2Transformer2DModel" or header.has("single_stream_modulation.")


QWEN21_MLP = ("img_mlp.gate_layer", "img_mlp.proj.", "img_mlp.out.",  # diffusers / ComfyUI
              "img_mlp_gate_layer", "img_mlp_proj", "img_mlp_out")  # kohya
QWEN_JOINT = ("add_q_proj", "add_k_proj", "add_v_proj", "img_mlp.net", "img_mlp_net", "txt_mlp",
              "img_mod", "txt_mod")  # Qwen-Image's (and FLUX.1's) double-stream modules
QWEN21_WIDTH = 4096  # 32 heads of 128 (Qwen-Image's and FLUX.1's blocks are 3072 wide)


def is_qwen21_lora(header: ModelHeader) -> bool:
    """A LoRA of Qwen-Image 2.1's single-stream blocks: its SwiGLU `img_mlp` (`proj` / `gate_layer`
    / `out`; Qwen-Image's is `img_mlp.net.0.proj` / `.net.2`), or attention projections alone
    (`transformer_blocks.N.attn.to_q`, no joint `add_q_proj`) 4096 wide. Qwen-Image's
    `recognise` refuses these (both have `transformer_blocks.N.img_mlp`)."""
    if any(header.has("transformer_blocks", part) for part in QWEN21_MLP):
        return True
    if any(header.has(joint) for joint in QWEN_JOINT):
        return False  # joint (double-stream) blocks: FLUX.1's or Qwen-Image's
    widths = [shape[-1] for key, shape in header.shapes.items()
              if "transformer_blocks" in key and any(q in key for q in (".attn.to_q.", "_attn_to_q."))
              and any(down in key for down in ("lora_A.", "lora_down."))]  # LTX-2's are attn1
    return bool(widths) and all(w == QWEN21_WIDTH for w in widths)


QWEN3_VL = ("Qwen3VLModel", "Qwen3VLForConditionalGeneration")


def is_qwen3_vl(header: ModelHeader) -> bool:
    """A Qwen3-VL (Krea 2's text encoder): per-head q_norm like Qwen3 (Z-Image's, FLUX.2
    Klein's), with its `visual.` tower or under `language_model.` (Gemma 3's `vision_tower` and
    `pre_feedforward_layernorm` excluded); Qwen2.5-VL has no q_norm."""
    if header.class_name in QWEN3_VL or header.config.get("model_type") == "qwen3_vl":
        return True
    if not header.has("self_attn.q_norm.") or header.has("pre_feedforward_layernorm"):
        return False
    return header.has("visual.") or (header.has("language_model.")
                                     and not header.has("vision_tower."))


def is_gemma(header: ModelHeader) -> bool:
    """A Gemma 3 / 4 text model (LTX-2's encoder, ComfyUI's text-only `model.layers.*` file
    too): per-head q_norm like Qwen3's, with the sandwich norms Qwen3 lacks
    (`pre_feedforward_layernorm`). Z-Image's and FLUX.2 Klein's Qwen3 tests refuse it."""
    return header.has("self_attn.q_norm.") and header.has("pre_feedforward_layernorm")
