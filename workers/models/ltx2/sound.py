"""A sound track into LTX-2's audio latents, as ComfyUI's LTXVAudioVAEEncode makes them
(comfy/ldm/lightricks/vae/audio_vae.py): resampled to the audio VAE's rate (torchaudio's
windowed-sinc resample), the log mel spectrogram (torchaudio's MelSpectrogram: Hann window,
centred reflect padding, magnitude, Slaney mel scale and norm), the VAE encoder's mode,
normalised by the VAE's per-channel statistics. diffusers' LTX-2 pipelines only decode sound;
torchaudio is not a dependency, so its two functions are written out here."""

from __future__ import annotations

import math
from typing import Any

import torch

N_FFT = 1024  # LTX-2's audio VAE config (ComfyUI reads n_fft from the checkpoint: 1024)


def resample(wave: torch.Tensor, rate: int, target: int) -> torch.Tensor:
    """`wave` [..., n] at `rate` → `target` Hz: torchaudio.functional.resample's defaults
    (sinc_interp_hann, lowpass_filter_width 6, rolloff 0.99)."""
    if rate == target:
        return wave
    gcd = math.gcd(rate, target)
    orig, new = rate // gcd, target // gcd
    base, zeros = min(orig, new) * 0.99, 6
    width = math.ceil(zeros * orig / base)
    idx = torch.arange(-width, width + orig, dtype=wave.dtype)[None, None] / orig
    t = (torch.arange(0, -new, -1, dtype=wave.dtype)[:, None, None] / new + idx) * base
    t = t.clamp_(-zeros, zeros)
    window = torch.cos(t * math.pi / zeros / 2) ** 2
    t = t * math.pi
    kernel = torch.where(t == 0, torch.tensor(1.0).to(t), t.sin() / t) * window * (base / orig)
    shape, length = wave.shape, wave.shape[-1]
    flat = torch.nn.functional.pad(wave.reshape(-1, length), (width, width + orig))
    out = torch.nn.functional.conv1d(flat[:, None], kernel, stride=orig)
    out = out.transpose(1, 2).reshape(flat.shape[0], -1)[..., :math.ceil(new * length / orig)]
    return out.view(*shape[:-1], out.shape[-1])


def _hz_to_mel(freq: float) -> float:  # Slaney's scale: linear below 1 kHz, log above
    if freq < 1000.0:
        return freq * 3.0 / 200.0
    return 15.0 + math.log(freq / 1000.0) / (math.log(6.4) / 27.0)


def _mel_to_hz(mels: torch.Tensor) -> torch.Tensor:
    freqs = mels * 200.0 / 3.0
    high = mels >= 15.0
    freqs[high] = 1000.0 * torch.exp(math.log(6.4) / 27.0 * (mels[high] - 15.0))
    return freqs


def mel_filters(rate: int, mels: int, n_fft: int = N_FFT) -> torch.Tensor:
    """[n_fft // 2 + 1, mels] triangular filters from 0 Hz to rate / 2, Slaney-normalised
    (torchaudio.functional.melscale_fbanks with norm and mel_scale "slaney")."""
    freqs = torch.linspace(0, rate // 2, n_fft // 2 + 1)
    points = _mel_to_hz(torch.linspace(_hz_to_mel(0.0), _hz_to_mel(rate / 2.0), mels + 2))
    gaps = points[1:] - points[:-1]
    slopes = points.unsqueeze(0) - freqs.unsqueeze(1)
    down, up = -slopes[:, :-2] / gaps[:-1], slopes[:, 2:] / gaps[1:]
    filters = torch.max(torch.zeros(1), torch.min(down, up))
    return filters * (2.0 / (points[2:mels + 2] - points[:mels])).unsqueeze(0)


def log_mel(wave: torch.Tensor, rate: int, mels: int, hop: int) -> torch.Tensor:
    """[1, C, frames, mels] log mel spectrogram of `wave` [1, C, n] at `rate`."""
    flat = wave.reshape(-1, wave.shape[-1])
    spec = torch.stft(flat, N_FFT, hop_length=hop, win_length=N_FFT,
                      window=torch.hann_window(N_FFT, dtype=wave.dtype), center=True,
                      pad_mode="reflect", normalized=False, onesided=True,
                      return_complex=True).abs()  # [C, freqs, frames]
    mel = (spec.transpose(-1, -2) @ mel_filters(rate, mels)).transpose(-1, -2)
    mel = torch.log(torch.clamp(mel, min=1e-5)).reshape(*wave.shape[:-1], mels, -1)
    return mel.permute(0, 1, 3, 2).contiguous()


def encode_audio(components: dict[str, Any], samples: Any, rate: int) -> torch.Tensor:
    """The packed, normalised audio latents [1, L, C·M] (float32) of a sound's samples
    [channels, n] at `rate` (mono doubled to the VAE's two channels), as ComfyUI encodes them."""
    from diffusers.pipelines.ltx2.pipeline_ltx2 import LTX2Pipeline

    audio_vae = components["audio_vae"]
    cfg = audio_vae.config
    wave = torch.as_tensor(samples, dtype=torch.float32).unsqueeze(0)  # [1, C, n]
    if wave.shape[1] == 1:
        wave = wave.expand(-1, cfg.in_channels, -1)
    if wave.shape[1] != cfg.in_channels:
        raise ValueError(f"the audio VAE takes {cfg.in_channels} channels, the sound has "
                         f"{wave.shape[1]}")
    wave = resample(wave, rate, cfg.sample_rate)
    mel = log_mel(wave, cfg.sample_rate, cfg.mel_bins, cfg.mel_hop_length)
    with torch.no_grad():
        latents = audio_vae.encode(mel.to(audio_vae.device, audio_vae.dtype)).latent_dist.mode()
    packed = LTX2Pipeline._pack_audio_latents(latents.float())
    mean = audio_vae.latents_mean.to(packed.device, packed.dtype)
    std = audio_vae.latents_std.to(packed.device, packed.dtype)
    return ((packed - mean) / std).cpu()
