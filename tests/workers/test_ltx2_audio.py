"""Sound in (issue ia2v): audio/trim cuts as ComfyUI's TrimAudioDuration does, and LTX-2's
audio-to-video: ltx2/encode-audio gives a clip its sound (ComfyUI's LTXVAudioVAEEncode with an
all-0 SetLatentNoiseMask), and ltx2/sample generates only the video, the sound's tokens seen
clean (timestep 0, as ComfyUI's 0 denoise mask and diffusers' LTX-2 DFR `freeze_audio` do)
and kept as they are, through a second stage too. diffusers has no audio-conditioned LTX-2
text/image-to-video pipeline: the video is checked against a hand-written loop of that rule."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from workers.models.values import Audio
from workers.runners import RUNNERS
from workers.runners.base import NodeFailed

W, H, FRAMES, FPS = 32, 32, 9, 25.0
SIGMAS = "1.0, 0.7, 0.4, 0.0"
OFF = {"cfg": 1.0, "stg": 0.0, "modality": 1.0, "rescale": 0.0, "audio_cfg": 1.0,
       "audio_stg": 0.0, "audio_modality": 1.0, "audio_rescale": 0.0, "stg_blocks": "1"}


def tone(seconds: float, rate: int, channels: int = 2) -> Audio:
    t = np.arange(int(seconds * rate)) / rate
    waves = [np.sin(2 * np.pi * f * t) for f in (440, 660)[:channels]]
    return Audio((0.4 * np.stack(waves)).astype(np.float32), rate)


def run(ctx: Any, node_type: str, params: dict[str, Any], inputs: dict[str, Any] | None = None
        ) -> Any:
    return RUNNERS[node_type](ctx, params, inputs or {})


@pytest.mark.parametrize(("start", "duration", "kept"), [
    (0.0, 60.0, (0, 100)),   # the template's: all of a shorter sound
    (0.25, 0.5, (25, 75)),
    (-0.3, 0.2, (70, 90)),   # counted from the end
])
def test_trim_keeps_the_stretch_comfyui_keeps(start, duration, kept):
    sound = Audio(np.arange(200, dtype=np.float32).reshape(2, 100), 100)
    out = run(None, "audio/trim", {"start": start, "duration": duration}, {"audio": sound})
    assert np.array_equal(out["audio"].samples, sound.samples[:, kept[0]:kept[1]])
    assert out["audio"].sample_rate == 100


def test_a_trim_outside_the_sound_is_a_clear_error():
    sound = Audio(np.zeros((1, 100), np.float32), 100)
    with pytest.raises(NodeFailed, match=r"outside the sound's 1\.000 s"):
        run(None, "audio/trim", {"start": 0.5, "duration": 0.0}, {"audio": sound})


def test_the_resample_is_torchaudio_s_rule_on_a_pure_tone():
    """A 440 Hz tone at 48 kHz resampled to 16 kHz: the length torchaudio gives (ceil) and,
    away from the edges, the same tone."""
    from workers.models.ltx2.sound import resample

    wave = torch.from_numpy(tone(0.5, 48000, channels=1).samples).unsqueeze(0)
    out = resample(wave, 48000, 16000)
    assert out.shape == (1, 1, 8000)
    expected = tone(0.5, 16000, channels=1).samples[0]
    assert np.abs(out[0, 0, 200:-200].numpy() - expected[200:-200]).max() < 1e-2


@pytest.fixture(scope="module")
def ltx2_stack(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    from workers.models.ltx2.plugin import write_tiny_stack

    models_dir = tmp_path_factory.mktemp("ltx2-audio-models")
    return models_dir, write_tiny_stack(models_dir)["checkpoint"]


def reference_video(components: dict[str, Any], prompt: Any, sound: Any, seed: int,
                    sigmas: list[float]) -> torch.Tensor:
    """ComfyUI's rule written out: the video from `seed`'s noise by Euler steps of the
    transformer's velocity, the sound's tokens fed clean at timestep (and cross σ) 0 and never
    stepped. Returns the video latents [1, C, F', h, w]."""
    from diffusers.pipelines.ltx2.pipeline_ltx2 import LTX2Pipeline

    from workers.models.ltx2.engine import latent_sizes
    from workers.runners.diffusion import noise

    transformer = components["transformer"]
    cfg = transformer.config
    f, h, w, _ = latent_sizes(components, W, H, FRAMES, FPS)
    video = noise((1, cfg.in_channels, f, h, w), torch.Generator("cpu").manual_seed(seed), "cpu")
    x = LTX2Pipeline._pack_latents(video, cfg.patch_size, cfg.patch_size_t)
    zero, levels = torch.zeros(1), torch.tensor(sigmas, dtype=torch.float32)
    for s, s_next in pairwise(levels):
        t = (s * 1000).expand(1)
        with torch.no_grad():
            v, _ = transformer(
                hidden_states=x.to(prompt.video.dtype), audio_hidden_states=sound.to(prompt.video.dtype),
                encoder_hidden_states=prompt.video, audio_encoder_hidden_states=prompt.audio,
                timestep=t, audio_timestep=zero, sigma=t, audio_sigma=zero,
                encoder_attention_mask=prompt.mask, audio_encoder_attention_mask=prompt.mask,
                num_frames=f, height=h, width=w, fps=FPS, audio_num_frames=sound.shape[1],
                use_cross_timestep=True, return_dict=False)
        x0 = x - v.float() * s
        x = (x.float() + (s_next - s) * ((x - x0) / s)).float()
    return LTX2Pipeline._unpack_latents(x, f, h, w, cfg.patch_size, cfg.patch_size_t)


def test_a_given_sound_is_kept_and_only_the_video_is_generated(ltx2_stack, make_ctx):
    from workers.models.ltx2.plugin import components_of
    from workers.models.ltx2.sound import encode_audio

    models_dir, name = ltx2_stack
    ctx = make_ctx(models_dir=models_dir)
    parts = run(ctx, "load/checkpoint", {"file": name})
    components = components_of(parts["model"].transformer)
    positive = run(ctx, "encode/text", {"text": "a man talking"},
                   {"encoder": parts["encoder"]})["conditioning"]
    empty = run(ctx, "ltx2/empty-latent", {"width": W, "height": H, "length": FRAMES,
                                           "fps": FPS})["latent"]
    sound = tone(0.4, 22050)  # resampled to the audio VAE's 16 kHz
    latent = run(ctx, "ltx2/encode-audio", {"keep": True},
                 {"vae": parts["vae"], "audio": sound, "latent": empty})["latent"]
    encoded = encode_audio(components, sound.samples, sound.sample_rate)
    assert torch.equal(latent.audio, encoded) and latent.audio_kept
    # mel frames: 0.4 s at 16 kHz / hop 160 + 1 = 41; the causal VAE's 4× in time: 11 latents
    assert latent.audio_frames == 11 == encoded.shape[1]
    sigmas = run(ctx, "sampling/manual-sigmas", {"sigmas": SIGMAS})["sigmas"]
    sampled = run(ctx, "ltx2/sample", {"seed": 3, "steps": 3, **OFF},
                  {"model": parts["model"], "positive": positive, "latent": latent,
                   "sigmas": sigmas})["latent"]
    assert torch.equal(sampled.audio.cpu(), encoded) and sampled.audio_kept
    expected = reference_video(components, positive.embeds, encoded, 3,
                               [float(s) for s in SIGMAS.split(",")])
    assert torch.equal(sampled.samples.cpu().float(), expected)
    refined = run(ctx, "ltx2/sample", {"seed": 4, "steps": 2, **OFF},
                  {"model": parts["model"], "positive": positive, "latent": sampled,
                   "sigmas": run(ctx, "sampling/manual-sigmas", {"sigmas": "0.5, 0.0"})["sigmas"]}
                  )["latent"]
    assert torch.equal(refined.audio.cpu(), encoded)  # a second stage keeps it too
    assert not torch.equal(refined.samples, sampled.samples)
    clip = run(ctx, "ltx2/decode", {}, {"vae": parts["vae"], "latent": refined})["video"]
    assert clip.frames.count == FRAMES and clip.audio is not None


def test_a_sound_as_a_start_is_noised_and_sampled(ltx2_stack, make_ctx):
    """keep off (ComfyUI's all-1 mask): the encoded sound is only where its sampling starts."""
    models_dir, name = ltx2_stack
    ctx = make_ctx(models_dir=models_dir)
    parts = run(ctx, "load/checkpoint", {"file": name})
    positive = run(ctx, "encode/text", {"text": "a man talking"},
                   {"encoder": parts["encoder"]})["conditioning"]
    empty = run(ctx, "ltx2/empty-latent", {"width": W, "height": H, "length": FRAMES,
                                           "fps": FPS})["latent"]
    latent = run(ctx, "ltx2/encode-audio", {"keep": False},
                 {"vae": parts["vae"], "audio": tone(0.4, 16000, channels=1), "latent": empty}
                 )["latent"]
    sampled = run(ctx, "ltx2/sample", {"seed": 3, "steps": 2, **OFF},
                  {"model": parts["model"], "positive": positive, "latent": latent})["latent"]
    assert not sampled.audio_kept and sampled.audio.shape == latent.audio.shape
    assert not torch.equal(sampled.audio.cpu(), latent.audio)


@pytest.mark.django_db
def test_a_sound_that_decodes_past_the_budget_is_refused_while_decoding(settings, tmp_path,
                                                                       make_ctx, monkeypatch):
    from tests.workers.vocab_helpers import sound_asset_of
    from workers.runners import audio

    settings.INLINE_BLOB_DIR = tmp_path / "blobs"
    asset = sound_asset_of("wav", seconds=1.0)  # 48 kHz stereo float32: 384 KiB decoded
    assert run(make_ctx(), "audio/load", {"asset": asset})["audio"].seconds == pytest.approx(1.0)
    monkeypatch.setattr(audio, "MAX_AUDIO_BYTES", 1 << 17)  # 128 KiB
    with pytest.raises(NodeFailed, match="decodes to more than 0 MiB"):
        run(make_ctx(), "audio/load", {"asset": asset})
