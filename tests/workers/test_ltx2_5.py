"""LTX-2.5's layout (a Gemma 4 text encoder; a transformer without the video feed-forward's bias
or the prompt AdaLN, with a keyframe embedding) on the tiny stack: diffusers 0.42.1 builds it,
the farm's engine renders what LTX2Pipeline renders over it, and an LTX-2.5 diffusers folder
loads offline and renders the same clip."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from workers.models.catalog import scan
from workers.models.header import read_header
from workers.models.ltx2 import FAMILY, engine

W, H, FRAMES, FPS, STEPS, SEQ = 32, 32, 9, 25.0, 2, 16
PROMPT = "a robot dancing"
GUIDANCE = engine.Guidance(stg_blocks=(1,))  # the pipeline's defaults; block 28 → the tiny one's 1


@pytest.fixture(scope="module")
def components() -> dict[str, Any]:
    from workers.models.ltx2.tiny import build_tiny_components

    return build_tiny_components(ltx25=True)


def farm_clip(components: dict[str, Any], seed: int) -> tuple[np.ndarray, np.ndarray, int]:
    run = engine.start(components, PROMPT, "", width=W, height=H, num_frames=FRAMES, fps=FPS,
                       steps=STEPS, generator=torch.Generator().manual_seed(seed),
                       guidance=GUIDANCE, max_sequence_length=SEQ)
    engine.denoise(components["transformer"], [run])
    return engine.decode(components, run)


def test_the_tiny_stack_has_ltx2_5_s_parts(components: dict[str, Any]) -> None:
    keys = set(components["transformer"].state_dict())
    assert "keyframes_abs_pos_embedding" in keys
    assert "transformer_blocks.0.prompt_scale_shift_table" in keys
    assert not any(k.startswith("prompt_adaln.") for k in keys)
    assert "transformer_blocks.0.ff.net.0.proj.weight" in keys
    assert "transformer_blocks.0.ff.net.0.proj.bias" not in keys
    assert "transformer_blocks.0.audio_ff.net.0.proj.bias" in keys
    assert type(components["text_encoder"]).__name__ == "Gemma4UnifiedForConditionalGeneration"


def test_a_clip_equals_ltx2_pipeline_s_over_the_same_components(components: dict[str, Any]) -> None:
    from diffusers import LTX2Pipeline

    pipe: Any = LTX2Pipeline(**components)
    pipe.set_progress_bar_config(disable=True)
    out = pipe(prompt=PROMPT, negative_prompt="", generator=torch.Generator().manual_seed(3),
               num_inference_steps=STEPS, height=H, width=W, num_frames=FRAMES, frame_rate=FPS,
               max_sequence_length=SEQ, output_type="np",
               spatio_temporal_guidance_blocks=list(GUIDANCE.stg_blocks))
    want = (out.frames[0] * 255).round().astype(np.uint8)
    frames, audio, rate = farm_clip(components, seed=3)
    assert frames.shape == (FRAMES, H, W, 3) and rate == 16000
    assert np.abs(frames.astype(int) - want.astype(int)).max() <= 1
    np.testing.assert_allclose(audio, out.audio[0].float().numpy(), atol=1e-4)


def test_an_ltx2_5_diffusers_folder_loads_offline_and_renders_the_same(
        components: dict[str, Any], tmp_path: Path) -> None:
    from diffusers import LTX2Pipeline

    from workers.models.ltx2.loading import load_folder

    folder = tmp_path / "checkpoints" / "tiny-ltx25"
    pipe: Any = LTX2Pipeline(**components)
    pipe.save_pretrained(folder, safe_serialization=True)
    assert [e["role"] for e in scan(tmp_path) if e["name"] == "tiny-ltx25"] == ["checkpoint"]
    header = read_header(folder / "transformer")
    assert header is not None and FAMILY.recognise(header) == "transformer"
    loaded = load_folder(folder)
    assert type(loaded["text_encoder"]).__name__ == "Gemma4UnifiedForConditionalGeneration"
    assert loaded["transformer"].config.use_keyframes_abs_pos_embedding
    loaded["vae"].use_framewise_decoding = False  # as the tiny stack (a runtime flag, not config)
    want, got = farm_clip(components, seed=5), farm_clip(loaded, seed=5)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
