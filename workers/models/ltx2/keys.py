"""LTX-2's all-in-one file in its original keys, as Lightricks publishes it and ComfyUI loads it
with CheckpointLoaderSimple (`ltx-2-19b-dev.safetensors`, `-fp8`):

    model.diffusion_model.*                       the audio-video transformer (`patchify_proj`,
                                                  `adaln_single`, `av_ca_*_adaln_single`, …)
    model.diffusion_model.{video,audio}_embeddings_connector.*   the text connectors
    text_embedding_projection.aggregate_embed.*   the connectors' projection of Gemma's layers
                                                  (LTX-2.3: one per modality, `video_` / `audio_`)
    vae.* / audio_vae.* / vocoder.*               the video VAE, the audio VAE, the vocoder

`from_original` splits it into the LTX2Pipeline components' diffusers state dicts: diffusers' own
converters for the transformer and the audio VAE (`convert_ltx2_transformer_to_diffusers`,
`convert_ltx2_audio_vae_to_diffusers`); the connectors and the vocoder with the renames of
diffusers' scripts/convert_ltx2_to_diffusers.py (not in the wheel); the video VAE with
`vae_from_original`, which reads any block count (diffusers' converter hard-codes the published
VAE's 4 down / 3 up blocks; a test checks the two agree on it). `to_original` is the inverse,
for the tiny stack and the tests.

LTX-2.3's file adds (its <stem>.diffusers/ configs say so: `gated_attn`, `cross_attn_mod`,
`per_modality_projections`): attention gates (`to_gate_logits`) and the blocks' prompt
scale-shift tables, in diffusers' names already; the prompt AdaLN (`prompt_adaln_single`,
`audio_prompt_adaln_single`), which diffusers' 2.0 converter leaves and `LTX23_PARTS` renames
(as diffusers' LTX-2 LoRA converter does); a projection of Gemma's layers per modality.
"""

from __future__ import annotations

from typing import Any

DIT = "model.diffusion_model."
PROJECTION = "text_embedding_projection."
# the original's projections of Gemma's stacked layers → the connectors' (2.0: one; 2.3: two)
PROJECTIONS = (("aggregate_embed", "text_proj_in"), ("video_aggregate_embed", "video_text_proj_in"),
               ("audio_aggregate_embed", "audio_text_proj_in"))
CONNECTORS = ("video_embeddings_connector.", "audio_embeddings_connector.")
PREFIXES = {"vae": "vae.", "audio_vae": "audio_vae.", "vocoder": "vocoder."}
# the original's name part → diffusers' (scripts/convert_ltx2_to_diffusers.py's tables)
CONNECTOR_PARTS = (("video_embeddings_connector", "video_connector"),
                   ("audio_embeddings_connector", "audio_connector"),
                   ("transformer_1d_blocks", "transformer_blocks"),
                   ("q_norm", "norm_q"), ("k_norm", "norm_k"))
VOCODER_PARTS = (("conv_pre", "conv_in"), ("conv_post", "conv_out"), ("ups", "upsamplers"),
                 ("resblocks", "resnets"))
# diffusers' transformer names → the original's (convert_ltx2_transformer_to_diffusers inverted)
TRANSFORMER_PARTS = (
    ("av_cross_attn_video_scale_shift", "av_ca_video_scale_shift_adaln_single"),
    ("av_cross_attn_video_a2v_gate", "av_ca_a2v_gate_adaln_single"),
    ("av_cross_attn_audio_scale_shift", "av_ca_audio_scale_shift_adaln_single"),
    ("av_cross_attn_audio_v2a_gate", "av_ca_v2a_gate_adaln_single"),
    ("video_a2v_cross_attn_scale_shift_table", "scale_shift_table_a2v_ca_video"),
    ("audio_a2v_cross_attn_scale_shift_table", "scale_shift_table_a2v_ca_audio"),
    ("norm_q", "q_norm"), ("norm_k", "k_norm"))
# LTX-2.3's prompt AdaLN, diffusers' names → the original's (convert_ltx2_transformer_to_diffusers
# predates it: from_original renames what it leaves)
LTX23_PARTS = (("prompt_adaln", "prompt_adaln_single"),
               ("audio_prompt_adaln", "audio_prompt_adaln_single"))
STATISTICS = {"latents_mean": "per_channel_statistics.mean-of-means",
              "latents_std": "per_channel_statistics.std-of-means"}


def is_single_file(keys: Any) -> bool:
    """The all-in-one file: the transformer under `model.diffusion_model.` with both VAEs."""
    keys = set(keys)
    return (any(k.startswith(DIT) for k in keys) and any(k.startswith("vae.") for k in keys)
            and any(k.startswith("audio_vae.") for k in keys))


def is_ltx23(keys: Any) -> bool:
    """LTX-2.3's layout: its prompt AdaLN, attention gates or per-modality projections."""
    return any("prompt_adaln_single." in k or ".to_gate_logits." in k
               or k.startswith(PROJECTION + "video_aggregate_embed.") for k in keys)


def from_original(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The all-in-one file's tensors → {component: diffusers state dict} for `transformer`,
    `connectors`, `vae`, `audio_vae`, `vocoder` (every key lands in one; unknown top-level keys
    go to `unknown`)."""
    from diffusers.loaders.single_file_utils import (
        convert_ltx2_audio_vae_to_diffusers,
        convert_ltx2_transformer_to_diffusers,
    )

    parts: dict[str, dict[str, Any]] = {name: {} for name in (
        "transformer", "connectors", "vae", "audio_vae", "vocoder", "unknown")}
    for key, value in state.items():
        parts[_component(key)][key] = value
    parts["transformer"] = {
        _renamed(k, tuple((old, new) for new, old in LTX23_PARTS)): v
        for k, v in convert_ltx2_transformer_to_diffusers(parts["transformer"]).items()}
    parts["connectors"] = {_connector(k): v for k, v in parts["connectors"].items()}
    parts["vae"] = vae_from_original({k.removeprefix("vae."): v for k, v in parts["vae"].items()})
    parts["audio_vae"] = convert_ltx2_audio_vae_to_diffusers(
        {k: v for k, v in parts["audio_vae"].items() if _kept_statistic(k)})
    parts["vocoder"] = {_renamed(k.removeprefix("vocoder."), VOCODER_PARTS): v
                        for k, v in parts["vocoder"].items()}
    return parts


def _component(key: str) -> str:
    if key.startswith(PROJECTION) or key.startswith(DIT + PROJECTION):
        return "connectors"
    if key.startswith(DIT):
        return "connectors" if key.removeprefix(DIT).startswith(CONNECTORS) else "transformer"
    for component, prefix in PREFIXES.items():
        if key.startswith(prefix):
            return component
    return "unknown"


def _connector(key: str) -> str:
    key = key.removeprefix(DIT)
    if key.startswith(PROJECTION):
        return _renamed(key.removeprefix(PROJECTION), PROJECTIONS)
    return _renamed(key, CONNECTOR_PARTS)


def _kept_statistic(key: str) -> bool:
    """The original's per-channel statistics that diffusers keeps (mean and std of the means;
    `channel` and `mean-of-stds` are dropped, as diffusers' video VAE converter drops them)."""
    return "per_channel_statistics." not in key or key.endswith(
        ("mean-of-means", "std-of-means"))


def vae_from_original(state: dict[str, Any]) -> dict[str, Any]:
    """The video VAE's original keys (without `vae.`) → AutoencoderKLLTX2Video's. The original
    lists the encoder's blocks flat (res blocks, downsampler, …, res blocks of the middle) and
    the decoder's (middle, upsampler, res blocks, …)."""
    down = {int(k.split(".")[2]) for k in state if k.startswith("encoder.down_blocks.")}
    last_down = max(down, default=0)
    out: dict[str, Any] = {}
    for key, value in state.items():
        if "per_channel_statistics." in key:
            if _kept_statistic(key):
                out[_statistic(key)] = value
            continue
        parts = key.split(".")
        if len(parts) > 2 and parts[1] in ("down_blocks", "up_blocks"):
            parts[1:3] = _block(parts[1], int(parts[2]), last_down).split(".")
        out[".".join(parts).replace(".res_blocks.", ".resnets.")] = value
    return out


def _block(kind: str, index: int, last_down: int) -> str:
    if kind == "down_blocks":
        if index == last_down:
            return "mid_block"
        return f"down_blocks.{index // 2}" + (".downsamplers.0" if index % 2 else "")
    if index == 0:
        return "mid_block"
    return f"up_blocks.{(index - 1) // 2}" + ("" if index % 2 == 0 else ".upsamplers.0")


def _statistic(key: str) -> str:
    return next(new for new, old in STATISTICS.items() if key.endswith(old))


def to_original(components: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """{component: diffusers state dict} → the all-in-one file's tensors (what from_original
    reads)."""
    out: dict[str, Any] = {}
    for key, value in components["transformer"].items():
        out[DIT + _transformer_original(key)] = value
    for key, value in components["connectors"].items():
        if key.split(".", 1)[0] in {new for _, new in PROJECTIONS}:
            out[PROJECTION + _renamed(key, tuple((new, old) for old, new in PROJECTIONS))] = value
        else:
            out[DIT + _renamed(key, tuple((new, old) for old, new in CONNECTOR_PARTS))] = value
    for key, value in vae_to_original(components["vae"]).items():
        out["vae." + key] = value
    for key, value in components["audio_vae"].items():
        out["audio_vae." + STATISTICS.get(key, key)] = value
    for key, value in components["vocoder"].items():
        out["vocoder." + _renamed(key, tuple((new, old) for old, new in VOCODER_PARTS))] = value
    return {key: value.contiguous() for key, value in out.items()}


def _transformer_original(key: str) -> str:
    if key.startswith("time_embed."):
        key = "adaln_single." + key.removeprefix("time_embed.")
    elif key.startswith("audio_time_embed."):
        key = "audio_adaln_single." + key.removeprefix("audio_time_embed.")
    elif key.startswith("proj_in."):
        key = "patchify_proj." + key.removeprefix("proj_in.")
    elif key.startswith("audio_proj_in."):
        key = "audio_patchify_proj." + key.removeprefix("audio_proj_in.")
    return _renamed(key, TRANSFORMER_PARTS + LTX23_PARTS)


def vae_to_original(state: dict[str, Any]) -> dict[str, Any]:
    """AutoencoderKLLTX2Video's keys → the original's (without `vae.`)."""
    down = {int(k.split(".")[2]) for k in state if k.startswith("encoder.down_blocks.")}
    mid = 2 * (max(down) + 1) if down else 0  # the encoder's middle: after every block's pair
    out: dict[str, Any] = {}
    for key, value in state.items():
        if key in STATISTICS:
            out[STATISTICS[key]] = value
            continue
        side, rest = key.split(".", 1)
        if rest.startswith("mid_block."):
            block, rest = (f"down_blocks.{mid}" if side == "encoder" else "up_blocks.0",
                           rest.removeprefix("mid_block."))
        elif rest.startswith(("down_blocks.", "up_blocks.")):
            kind, index, rest = rest.split(".", 2)
            sampler = rest.startswith(("downsamplers.0.", "upsamplers.0."))
            rest = rest.split(".", 2)[2] if sampler else rest
            number = (2 * int(index) + (1 if sampler else 0) if kind == "down_blocks"
                      else 2 * int(index) + (1 if sampler else 2))
            block = f"{kind}.{number}"
        else:
            out[key] = value
            continue
        out[f"{side}.{block}.{rest}".replace(".resnets.", ".res_blocks.")] = value
    return out


def _renamed(key: str, parts: tuple[tuple[str, str], ...]) -> str:
    """`key` with each (old, new) swapped where `old` is whole dotted parts of it."""
    padded = f".{key}."
    for old, new in parts:
        padded = padded.replace(f".{old}.", f".{new}.")
    return padded[1:-1]
