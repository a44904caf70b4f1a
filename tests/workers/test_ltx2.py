"""LTX-2 (issue 37): the farm's engine against diffusers' LTX2Pipeline on a tiny random stack
(frames as uint8 and the vocoder's audio, with the pipeline's default CFG + STG + modality
guidance and with CFG alone), runs of different prompts batched in one transformer call, the
finished clip through the video values into an MP4 with AAC audio, and file recognition."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
import torch

from workers.models.header import ModelHeader
from workers.models.ltx2 import FAMILY, activation_gb, engine, latent_frames
from workers.models.values import Video
from workers.video import video_write

W, H, FRAMES, FPS, STEPS, SEQ = 32, 32, 9, 25.0, 3, 16
PROMPT = "a robot dancing"
DEFAULTS = engine.Guidance(stg_blocks=(1,))  # the pipeline's defaults; block 28 → the tiny one's 1
CFG_ONLY = engine.Guidance(
    cfg=4.0,
    stg=0.0,
    modality=1.0,
    rescale=0.0,
    audio_cfg=4.0,
    audio_stg=0.0,
    audio_modality=1.0,
    audio_rescale=0.0,
)


@pytest.fixture(scope="module")
def components() -> dict[str, Any]:
    from workers.models.ltx2.tiny import build_tiny_components

    return build_tiny_components()


def pipeline_output(
    components: dict[str, Any], g: engine.Guidance, seed: int, prompt: str = PROMPT
) -> tuple[np.ndarray, np.ndarray]:
    from diffusers import LTX2Pipeline

    pipe: Any = LTX2Pipeline(**components)
    pipe.set_progress_bar_config(disable=True)
    out = pipe(
        prompt=prompt,
        negative_prompt="",
        generator=torch.Generator().manual_seed(seed),
        num_inference_steps=STEPS,
        height=H,
        width=W,
        num_frames=FRAMES,
        frame_rate=FPS,
        max_sequence_length=SEQ,
        output_type="np",
        guidance_scale=g.cfg,
        stg_scale=g.stg,
        modality_scale=g.modality,
        guidance_rescale=g.rescale,
        audio_guidance_scale=g.audio_cfg,
        audio_stg_scale=g.audio_stg,
        audio_modality_scale=g.audio_modality,
        audio_guidance_rescale=g.audio_rescale,
        spatio_temporal_guidance_blocks=list(g.stg_blocks),
    )
    frames = (out.frames[0] * 255).round().astype(np.uint8)  # diffusers' numpy_to_pil rounding
    return frames, out.audio[0].float().numpy()


def farm_run(
    components: dict[str, Any], g: engine.Guidance, seed: int, prompt: str = PROMPT
) -> engine.Ltx2Run:
    return engine.start(
        components,
        prompt,
        "",
        width=W,
        height=H,
        num_frames=FRAMES,
        fps=FPS,
        steps=STEPS,
        generator=torch.Generator().manual_seed(seed),
        guidance=g,
        max_sequence_length=SEQ,
    )


@pytest.mark.parametrize("guidance", [DEFAULTS, CFG_ONLY], ids=["defaults", "cfg-only"])
def test_frames_and_audio_equal_the_pipeline(components: dict[str, Any], guidance: engine.Guidance) -> None:
    want_frames, want_audio = pipeline_output(components, guidance, seed=3)
    run = farm_run(components, guidance, seed=3)
    engine.denoise(components["transformer"], [run])
    frames, audio, rate = engine.decode(components, run)
    assert frames.shape == (FRAMES, H, W, 3) and frames.dtype == np.uint8
    np.testing.assert_array_equal(frames, want_frames)
    assert audio.shape == want_audio.shape and audio.shape[0] == 2
    np.testing.assert_array_equal(audio, want_audio)
    assert rate == 16000
    assert guidance.passes() == (("cond", "stg", "modality") if guidance is DEFAULTS else ("cond",))


def test_runs_batch_in_one_forward(components: dict[str, Any]) -> None:
    """Two runs (other prompts and seeds) share each transformer call; what each gets equals
    its run alone up to float32 reduction order (latents 1e-5, frames ±1, audio 1e-5)."""
    together = [farm_run(components, DEFAULTS, 0), farm_run(components, DEFAULTS, 1, "a cat")]
    engine.denoise(components["transformer"], together)
    for batched in together:
        alone = farm_run(
            components,
            DEFAULTS,
            0 if batched is together[0] else 1,
            PROMPT if batched is together[0] else "a cat",
        )
        engine.denoise(components["transformer"], [alone])
        assert torch.allclose(batched.latents, alone.latents, atol=1e-5, rtol=0)
        assert torch.allclose(batched.audio, alone.audio, atol=1e-5, rtol=0)
        (f1, a1, _), (f2, a2, _) = engine.decode(components, batched), engine.decode(components, alone)
        assert np.abs(f1.astype(int) - f2).max() <= 1
        assert np.abs(a1 - a2).max() <= 1e-5
    assert not torch.equal(together[0].latents, together[1].latents)


def test_clip_encodes_as_mp4_with_aac(components: dict[str, Any], tmp_path: Path) -> None:
    run = farm_run(components, CFG_ONLY, 5)
    engine.denoise(components["transformer"], [run])
    video = engine.to_video(components, run)
    assert isinstance(video, Video) and video.audio is not None and video.fps == FPS
    audio, rate = video.audio.samples, video.audio.sample_rate
    facts = video_write(video, tmp_path / "take.mp4", format="mp4", crf=18, comment="ltx2")
    assert facts.frame_count == FRAMES and facts.audio_seconds == pytest.approx(audio.shape[1] / rate)
    with av.open(str(tmp_path / "take.mp4")) as f:
        vs, aus = f.streams.video[0], f.streams.audio[0]
        assert (vs.codec_context.name, aus.codec_context.name) == ("h264", "aac")
        assert vs.average_rate is not None and float(vs.average_rate) == FPS
        decoded = sum(1 for _ in f.decode(video=0))
    assert decoded == FRAMES
    with av.open(str(tmp_path / "take.mp4")) as f:
        samples = sum(fr.samples for fr in f.decode(audio=0))
        got_rate = f.streams.audio[0].rate
    # AAC pads with whole 1024-sample frames and its priming: the track is at least the clip's sound
    assert got_rate * audio.shape[1] / rate <= samples <= got_rate * audio.shape[1] / rate + 2 * 1024


def test_recognises_its_files(components: dict[str, Any]) -> None:
    def header(module: Any, prefix: str = "") -> ModelHeader:
        return ModelHeader({prefix + k: tuple(v.shape) for k, v in module.state_dict().items()})

    assert FAMILY.recognise(header(components["transformer"])) == "transformer"
    assert FAMILY.recognise(header(components["transformer"], "model.diffusion_model.")) == "transformer"
    assert FAMILY.recognise(header(components["vae"])) == "vae"
    assert FAMILY.recognise(header(components["audio_vae"])) == "vae"
    assert FAMILY.recognise(header(components["text_encoder"])) == "text_encoder"
    assert FAMILY.recognise(header(components["vocoder"])) is None
    assert FAMILY.recognise(ModelHeader({"decoder.conv_in.weight": (512, 16, 3, 3)})) is None
    # the original layout (diffusers' converters read it): the transformer alone, and the
    # all-in-one file with both VAEs
    original: dict[str, tuple[int, ...]] = {
        "model.diffusion_model.audio_patchify_proj.weight": (2048, 128),
        "model.diffusion_model.av_ca_a2v_gate_adaln_single.linear.weight": (4096, 4096),
    }
    assert FAMILY.recognise(ModelHeader(original)) == "transformer"
    both: dict[str, tuple[int, ...]] = {
        **original,
        "vae.per_channel_statistics.mean-of-means": (128,),
        "audio_vae.per_channel_statistics.mean-of-means": (128,),
    }
    assert FAMILY.recognise(ModelHeader(both)) == "checkpoint"


def test_vram_counts_frames() -> None:
    assert latent_frames(121) == 16 and latent_frames(9) == 2
    short, long = activation_gb(768, 512, 9), activation_gb(768, 512, 121)
    assert 2.0 < short < long
    assert activation_gb(1536, 1024, 121) > 3 * (long - 2.0)
    # routing's estimate (apps/fleet/routing.py): the family's base + per megapixel of every
    # frame (ltx2/empty-latent's width × height × length), the same figure
    from apps.fleet.routing import need_estimate

    for w, h, frames in ((768, 512, 121), (1280, 704, 97), (512, 512, 49)):
        need = need_estimate(model_sizes=[1], pixels=w * h * frames,
                             activation=(FAMILY.activation_gb, FAMILY.activation_gb_per_mpx))
        assert need.activations_gb == pytest.approx(activation_gb(w, h, frames), rel=0.05)


def test_tiny_stack_loads_locally_and_renders_the_same(components: dict[str, Any], tmp_path: Path) -> None:
    """The stack written as a diffusers folder loads offline (cached), its files are recognised
    from their own headers, and it renders what the in-memory stack renders."""
    from workers.models.family import ModelLoadError
    from workers.models.header import read_header
    from workers.models.ltx2.loading import load_folder
    from workers.models.ltx2.tiny import write_tiny_stack

    names = write_tiny_stack(tmp_path)
    folder = tmp_path / "checkpoints" / names["checkpoint"]
    roles = {}
    for part in ("transformer", "vae", "audio_vae", "text_encoder", "vocoder"):
        header = read_header(folder / part)
        assert header is not None
        roles[part] = FAMILY.recognise(header)
    assert roles == {
        "transformer": "transformer",
        "vae": "vae",
        "audio_vae": "vae",
        "text_encoder": "text_encoder",
        "vocoder": None,
    }
    loaded = load_folder(folder)
    assert load_folder(folder) is loaded
    loaded["vae"].use_framewise_decoding = False  # as the tiny stack (a runtime flag, not config)
    runs = []
    for stack in (components, loaded):
        run = engine.start(
            stack,
            PROMPT,
            "",
            width=W,
            height=H,
            num_frames=FRAMES,
            fps=FPS,
            steps=2,
            generator=torch.Generator().manual_seed(9),
            guidance=CFG_ONLY,
            max_sequence_length=SEQ,
        )
        engine.denoise(stack["transformer"], [run])
        runs.append(engine.decode(stack, run))
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    np.testing.assert_array_equal(runs[0][1], runs[1][1])
    (folder / "vocoder").rename(tmp_path / "vocoder-away")
    with pytest.raises(ModelLoadError, match="smoke-ltx2: the LTX-2 folder lacks vocoder"):
        load_folder(folder)


def test_image_to_video_equals_the_pipeline(components: dict[str, Any]) -> None:
    """LTX2ImageToVideoPipeline (its defaults: H.264 CRF 33 re-compression of the image, frame 0
    held at the image's latents with timestep 0): the same frames and audio."""
    from diffusers import LTX2ImageToVideoPipeline
    from PIL import Image

    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (48, 40, 3), dtype=np.uint8))
    pipe: Any = LTX2ImageToVideoPipeline(**components)
    pipe.set_progress_bar_config(disable=True)
    out = pipe(
        image=image,
        prompt=PROMPT,
        negative_prompt="",
        generator=torch.Generator().manual_seed(4),
        num_inference_steps=STEPS,
        height=H,
        width=W,
        num_frames=FRAMES,
        frame_rate=FPS,
        max_sequence_length=SEQ,
        output_type="np",
        spatio_temporal_guidance_blocks=[1],
    )
    run = engine.start(
        components,
        PROMPT,
        "",
        width=W,
        height=H,
        num_frames=FRAMES,
        fps=FPS,
        steps=STEPS,
        generator=torch.Generator().manual_seed(4),
        guidance=DEFAULTS,
        max_sequence_length=SEQ,
        image=image,
    )
    engine.denoise(components["transformer"], [run])
    frames, audio, _ = engine.decode(components, run)
    np.testing.assert_array_equal(frames, (out.frames[0] * 255).round().astype(np.uint8))
    np.testing.assert_array_equal(audio, out.audio[0].float().numpy())
    # an image-to-video run and a text-to-video one share each transformer call
    mixed = [
        engine.start(
            components,
            PROMPT,
            "",
            width=W,
            height=H,
            num_frames=FRAMES,
            fps=FPS,
            steps=STEPS,
            generator=torch.Generator().manual_seed(4),
            guidance=DEFAULTS,
            max_sequence_length=SEQ,
            image=image,
        ),
        farm_run(components, DEFAULTS, 4),
    ]
    engine.denoise(components["transformer"], mixed)
    alone = farm_run(components, DEFAULTS, 4)
    engine.denoise(components["transformer"], [alone])
    assert torch.allclose(mixed[0].latents, run.latents, atol=1e-5, rtol=0)
    assert torch.allclose(mixed[1].latents, alone.latents, atol=1e-5, rtol=0)
