"""LTX-2 (audio + video) through diffusers 0.42's own modules, reproducing `LTX2Pipeline`
(text-to-video with its audio track) step for step on CPU: Gemma3 hidden states of every layer
through the text connectors, the pipeline's shifted flow sigmas (one schedule for video and
audio), its guidance (CFG + spatio-temporal guidance + modality-isolation guidance + rescale, all
in x0 space, with its defaults), Euler steps, the video VAE decode to uint8 frames and the audio
VAE + vocoder decode to a float waveform.

`Ltx2Run` is one run's state; `forward(transformer, runs, kind)` is one denoiser call over the rows
of several runs of the same size (the step batcher's unit: `kind` picks the pass, "cond" = the
negative and positive rows, "stg" / "modality" = the perturbed passes), `advance(run, outs)` mixes
the passes and takes the Euler step.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

STG_BLOCKS_DEFAULT = (28,)  # LTX2Pipeline's spatio_temporal_guidance_blocks default


@dataclass(frozen=True)
class Guidance:
    """LTX2Pipeline's guidance knobs (its defaults). The audio values default to the pipeline's
    own audio defaults; `stg_blocks` are transformer block indices (the pipeline's [28] needs a
    48-block transformer)."""

    cfg: float = 3.0
    stg: float = 1.0
    modality: float = 3.0
    rescale: float = 0.7
    audio_cfg: float = 7.0
    audio_stg: float = 1.0
    audio_modality: float = 3.0
    audio_rescale: float = 0.7
    stg_blocks: tuple[int, ...] = STG_BLOCKS_DEFAULT

    @property
    def do_cfg(self) -> bool:
        return self.cfg > 1.0 or self.audio_cfg > 1.0

    @property
    def do_stg(self) -> bool:
        return self.stg > 0.0 or self.audio_stg > 0.0

    @property
    def do_modality(self) -> bool:
        return self.modality > 1.0 or self.audio_modality > 1.0

    def passes(self) -> tuple[str, ...]:
        return ("cond",) + (("stg",) if self.do_stg else ()) + (("modality",) if self.do_modality else ())


@dataclass
class Ltx2Run:
    """One run: packed video latents [1, tokens, C] and audio latents [1, L, C·M], its prompt
    (connector outputs, negative row first when guided) and the schedule."""

    latents: torch.Tensor
    audio: torch.Tensor
    video_embeds: torch.Tensor  # [rows, S, D]: (negative, positive) under CFG, else (positive,)
    audio_embeds: torch.Tensor
    mask: torch.Tensor
    sigmas: torch.Tensor  # [n + 1]
    timesteps: torch.Tensor  # [n]
    frames: int  # latent frames, height, width; audio latent length
    height: int
    width: int
    audio_frames: int
    fps: float
    guidance: Guidance
    step: int = 0
    # conditioning (image-to-video's first frame, keyframe guides): [1, tokens], each token's
    # strength m (0: free; 1: held at its clean latents, LTX2ImageToVideoPipeline's first
    # frame; below: ComfyUI's denoise mask 1 − m, LTX2ConditionPipeline's conditioning_mask),
    # and the clean latents [1, tokens, C] it holds to
    held: torch.Tensor | None = None
    clean: torch.Tensor | None = None
    # [1, tokens]: where the transformer sees x·(1 − m) + clean·m (ComfyUI's image-to-video
    # below strength 1); elsewhere it sees the state x (LTX2ConditionPipeline's guides)
    mixed: torch.Tensor | None = None
    # keyframe guides appended after the clip's tokens (LTX2ConditionPipeline's keyframes): the
    # pixel frame of each and their positions [1, 3, guide tokens, 2]
    guide_frames: tuple[int, ...] = ()
    keyframe_coords: torch.Tensor | None = None
    scheduler: Any = field(default=None, repr=False)
    audio_scheduler: Any = field(default=None, repr=False)


def encode_prompts(
    components: dict[str, Any], texts: list[str], max_sequence_length: int = 1024
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(video embeds, audio embeds, mask) of `texts` in one Gemma3 call and one connectors call,
    as LTX2Pipeline builds them (every hidden state stacked, left padding)."""
    tok, encoder = components["tokenizer"], components["text_encoder"]
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    inputs = tok(
        [t.strip() for t in texts],
        padding="max_length",
        max_length=max_sequence_length,
        truncation=True,
        add_special_tokens=True,
        return_tensors="pt",
    )
    with torch.no_grad():
        out = encoder(
            input_ids=inputs.input_ids, attention_mask=inputs.attention_mask, output_hidden_states=True
        )
        embeds = torch.stack(out.hidden_states, dim=-1).flatten(2, 3).to(encoder.dtype)
        video, audio, mask = components["connectors"](embeds, inputs.attention_mask, padding_side="left")
    return video, audio, mask


def latent_sizes(
    components: dict[str, Any], width: int, height: int, num_frames: int, fps: float
) -> tuple[int, int, int, int]:
    """(latent frames, latent height, latent width, audio latent length) of a clip."""
    vae, audio_vae = components["vae"], components["audio_vae"]
    t, s = vae.temporal_compression_ratio, vae.spatial_compression_ratio
    per_second = (
        audio_vae.config.sample_rate
        / audio_vae.config.mel_hop_length
        / float(audio_vae.temporal_compression_ratio)
    )
    return (num_frames - 1) // t + 1, height // s, width // s, round(num_frames / fps * per_second)


def schedule(scheduler: Any, steps: int, tokens: int) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """A fresh copy of the pipeline's scheduler set for `steps` over `tokens` video tokens (its
    resolution-dependent shift μ); returns (scheduler, sigmas [n + 1], timesteps [n])."""
    from diffusers.pipelines.ltx2.pipeline_ltx2 import calculate_shift

    sched = copy.deepcopy(scheduler)
    cfg = sched.config
    mu = calculate_shift(
        tokens,
        cfg.get("base_image_seq_len", 1024),
        cfg.get("max_image_seq_len", 4096),
        cfg.get("base_shift", 0.95),
        cfg.get("max_shift", 2.05),
    )
    sched.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
    sched.set_begin_index(0)
    return sched, sched.sigmas, sched.timesteps


def manual_schedule(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sigmas [n + 1], timesteps [n]) of sigmas written by hand (ComfyUI's ManualSigmas: the
    first to the last, used as they are), as FlowMatchEulerDiscreteScheduler sets them from
    LTX2Pipeline's `sigmas` (values[:-1], the last 0) without shifting: float32, σ·1000."""
    sigmas = values.to(torch.float32)
    return sigmas, sigmas[:-1] * 1000


def start(
    components: dict[str, Any],
    prompt: str,
    negative: str,
    *,
    width: int,
    height: int,
    num_frames: int,
    fps: float,
    steps: int,
    generator: torch.Generator,
    guidance: Guidance = Guidance(),
    max_sequence_length: int = 1024,
    image: Any = None,
    image_crf: int | None = None,
) -> Ltx2Run:
    """A run's start: its prompt rows, noise (video then audio, from `generator` as the pipeline
    draws them) and schedule."""
    from diffusers.pipelines.ltx2.pipeline_ltx2 import LTX2Pipeline
    from diffusers.utils.torch_utils import randn_tensor

    texts = [negative, prompt] if guidance.do_cfg else [prompt]
    video_embeds, audio_embeds, text_mask = encode_prompts(components, texts, max_sequence_length)
    f, h, w, audio_len = latent_sizes(components, width, height, num_frames, fps)
    transformer, audio_vae = components["transformer"], components["audio_vae"]
    ps, pt = transformer.config.patch_size, transformer.config.patch_size_t
    shape = (1, transformer.config.in_channels, f, h, w)
    frames_mask = packed_first = None
    if image is None:
        latents = randn_tensor(shape, generator=generator, dtype=torch.float32)
    else:  # LTX2ImageToVideoPipeline: the image's latents as frame 0, noise elsewhere
        first = encode_first_frame(components, image, width, height, image_crf, video_embeds.dtype)
        frame0 = torch.zeros((1, 1, f, h, w), dtype=torch.float32)
        frame0[:, :, 0] = 1.0
        noise = randn_tensor(shape, generator=generator, dtype=torch.float32)
        latents = first.repeat(1, 1, f, 1, 1) * frame0 + noise * (1 - frame0)
        frames_mask = LTX2Pipeline._pack_latents(frame0, ps, pt).squeeze(-1)
        packed_first = LTX2Pipeline._pack_latents(first.repeat(1, 1, f, 1, 1).float(), ps, pt)
    latents = LTX2Pipeline._pack_latents(latents, ps, pt)
    mel = audio_vae.config.mel_bins // audio_vae.mel_compression_ratio
    audio = randn_tensor(
        (1, audio_vae.config.latent_channels, audio_len, mel), generator=generator, dtype=torch.float32
    )
    audio = LTX2Pipeline._pack_audio_latents(audio)
    sched, sigmas, timesteps = schedule(components["scheduler"], steps, latents.shape[1])
    audio_sched, _, _ = schedule(components["scheduler"], steps, latents.shape[1])
    return Ltx2Run(
        latents,
        audio,
        video_embeds,
        audio_embeds,
        text_mask,
        sigmas,
        timesteps,
        f,
        h,
        w,
        audio_len,
        fps,
        guidance,
        scheduler=sched,
        audio_scheduler=audio_sched,
        held=frames_mask,
        clean=packed_first,
        mixed=frames_mask,
    )


def encode_first_frame(
    components: dict[str, Any], image: Any, width: int, height: int, crf: int | None, dtype: torch.dtype
) -> torch.Tensor:
    """The normalised latents [1, C, 1, h, w] of a PIL image as LTX2ImageToVideoPipeline makes
    them: H.264 re-compressed at `crf` (None: the model's default, 33 for Gemma3 LTX-2), resized
    bilinearly, the VAE's mode."""
    from diffusers.pipelines.ltx2.utils import apply_image_conditioning_crf, resolve_default_image_crf
    from diffusers.video_processor import VideoProcessor
    from PIL import Image

    vae = components["vae"]
    crf = crf if crf is not None else resolve_default_image_crf(components["text_encoder"])
    if crf != 0:
        image = Image.fromarray(apply_image_conditioning_crf(np.array(image.convert("RGB")), crf))
    processor = VideoProcessor(vae_scale_factor=vae.spatial_compression_ratio, resample="bilinear")
    pixels = processor.preprocess(image, height=height, width=width).to(dtype=dtype)
    with torch.no_grad():
        latents = vae.encode(pixels[0].unsqueeze(0).unsqueeze(2)).latent_dist.mode()
    mean = vae.latents_mean.view(1, -1, 1, 1, 1).to(latents.dtype)
    std = vae.latents_std.view(1, -1, 1, 1, 1).to(latents.dtype)
    return ((latents - mean) / std).to(dtype)


def encode_guide(
    components: dict[str, Any], image: Any, width: int, height: int, crf: int | None
) -> torch.Tensor:
    """The normalised latents [1, C, 1, h, w] (float32) of a PIL image as a keyframe guide, as
    LTX2ConditionPipeline makes a condition's: H.264 re-compressed at `crf` (None: the model's
    default), cut to the clip's aspect at its centre and scaled bilinearly (ComfyUI's
    common_upscale, which LTXVAddGuide uses; of the same aspect, the pipeline's resize), the
    VAE's mode."""
    from diffusers.pipelines.ltx2.pipeline_ltx2_condition import LTX2ConditionPipeline
    from diffusers.pipelines.ltx2.utils import apply_image_conditioning_crf, resolve_default_image_crf

    from workers.runners.image_ops import centre_crop_box

    vae = components["vae"]
    crf = crf if crf is not None else resolve_default_image_crf(components["text_encoder"])
    pixels = np.array(image.convert("RGB"))
    if crf != 0:
        pixels = apply_image_conditioning_crf(pixels, crf)
    left, top, right, bottom = centre_crop_box(pixels.shape[1], pixels.shape[0], width / height)
    tensor = torch.from_numpy(np.ascontiguousarray(pixels[top:bottom, left:right])).to(torch.float32)
    tensor = torch.nn.functional.interpolate(tensor.permute(2, 0, 1).unsqueeze(0),
                                             size=(height, width), mode="bilinear",
                                             align_corners=False)  # [1, 3, H, W], 0…255
    tensor = (tensor / 127.5 - 1.0).unsqueeze(2).to(vae.device, vae.dtype)  # [1, 3, 1, H, W]
    with torch.no_grad():
        latents = vae.encode(tensor).latent_dist.mode()
    return LTX2ConditionPipeline._normalize_latents(
        latents, vae.latents_mean, vae.latents_std).to(torch.float32)


def model_input(run: Ltx2Run) -> torch.Tensor:
    """The video latents the transformer sees: on image-to-video's first frame the state mixed
    toward the image by the conditioning's strength m (x·(1 − m) + image·m: the image itself at
    m = 1, ComfyUI's inpainting blend below), the state elsewhere."""
    if run.mixed is None or run.clean is None:
        return run.latents
    m = run.mixed.unsqueeze(-1)
    return run.latents * (1 - m) + run.clean * m


def keyframe_coords(frame: int, height: int, width: int, scales: tuple[int, int, int],
                    patches: tuple[int, int], fps: float) -> torch.Tensor:
    """The positions [1, 3, h·w / p², 2] (start, end of time in seconds, of y and x in pixels)
    of a one-frame guide's tokens at pixel `frame`, as LTX2ConditionPipeline places a keyframe
    (its _prepare_keyframe_coords: no causal fix, time clamped to [frame, frame + 1)).
    `scales`: the VAE's (time, y, x) ratios; `patches`: the transformer's (space, time)."""
    ps, pt = patches
    grid = torch.stack(torch.meshgrid(
        torch.arange(0, 1, pt, dtype=torch.float32), torch.arange(0, height, ps, dtype=torch.float32),
        torch.arange(0, width, ps, dtype=torch.float32), indexing="ij"), dim=0)  # [3, 1, h, w]
    ends = grid + torch.tensor((pt, ps, ps), dtype=grid.dtype).view(3, 1, 1, 1)
    coords = torch.stack([grid, ends], dim=-1).flatten(1, 3).unsqueeze(0)  # [1, 3, N, 2]
    pixels = coords * torch.tensor(scales, dtype=coords.dtype).view(1, -1, 1, 1)
    pixels[:, 0, :, :] = pixels[:, 0, :, :] + frame
    pixels[:, 0, :, 1:] = pixels[:, 0, :, :1] + 1
    pixels[:, 0, :, :] = pixels[:, 0, :, :] / fps
    return pixels


def forward(transformer: Any, runs: list[Ltx2Run], kind: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One transformer call over the rows of `runs` (same sizes, same step) for pass `kind`:
    each run's (video velocity, audio velocity), float32, [rows, …]."""
    first = runs[0]
    cond = kind == "cond"
    rows = [(r.video_embeds.shape[0] if cond else 1) for r in runs]

    def pick(t: torch.Tensor, r: Ltx2Run) -> torch.Tensor:  # the positive row for perturbed passes
        return t if cond else t[-1:]

    dtype = first.video_embeds.dtype
    latents = torch.cat([model_input(r).expand(n, -1, -1) for r, n in zip(runs, rows, strict=True)]).to(dtype)
    audio = torch.cat([r.audio.expand(n, -1, -1) for r, n in zip(runs, rows, strict=True)]).to(dtype)
    timestep = torch.cat([r.timesteps[r.step].expand(n) for r, n in zip(runs, rows, strict=True)])
    video_timestep = timestep
    if any(r.held is not None for r in runs):  # conditioned tokens at t·(1 − m)
        tokens = first.latents.shape[1]
        masks = [
            (r.held if r.held is not None else torch.zeros(1, tokens)).expand(n, -1)
            for r, n in zip(runs, rows, strict=True)
        ]
        video_timestep = timestep.unsqueeze(-1) * (1 - torch.cat(masks))
    video_coords = transformer.rope.prepare_video_coords(
        sum(rows), first.frames, first.height, first.width, latents.device, fps=first.fps
    )
    if first.keyframe_coords is not None:  # the runs' guides (the same: predict groups by them)
        keyframes = first.keyframe_coords.to(video_coords.device, video_coords.dtype)
        video_coords = torch.cat([video_coords, keyframes.expand(sum(rows), -1, -1, -1)], dim=2)
    audio_coords = transformer.audio_rope.prepare_audio_coords(sum(rows), first.audio_frames, audio.device)
    mask = torch.cat([pick(r.mask, r) for r in runs])
    with torch.no_grad():
        video_out, audio_out = transformer(
            hidden_states=latents,
            audio_hidden_states=audio,
            encoder_hidden_states=torch.cat([pick(r.video_embeds, r) for r in runs]),
            audio_encoder_hidden_states=torch.cat([pick(r.audio_embeds, r) for r in runs]),
            timestep=video_timestep,
            audio_timestep=timestep if video_timestep is not timestep else None,
            sigma=timestep,
            encoder_attention_mask=mask,
            audio_encoder_attention_mask=mask,
            num_frames=first.frames,
            height=first.height,
            width=first.width,
            fps=first.fps,
            audio_num_frames=first.audio_frames,
            video_coords=video_coords,
            audio_coords=audio_coords,
            isolate_modalities=kind == "modality",
            spatio_temporal_guidance_blocks=list(first.guidance.stg_blocks) if kind == "stg" else None,
            perturbation_mask=None,
            use_cross_timestep=True,
            return_dict=False,
        )
    video_out, audio_out = video_out.float(), audio_out.float()
    return list(zip(video_out.split(rows), audio_out.split(rows), strict=True))


def guided_step(
    run: Ltx2Run, outs: dict[str, tuple[torch.Tensor, torch.Tensor]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The run's next (video latents, audio latents) from its passes' predictions, mixed as
    LTX2Pipeline mixes them (x0 space), the conditioned tokens' x0 then mixed toward their
    clean latents by their strength (the first frame's image, the guides: LTX2ConditionPipeline's
    blend, ComfyUI's inpainting one; at strength 1 the clean latents), then its
    scheduler's Euler step (x + (σ' − σ)·v in float32, as FlowMatchEulerDiscreteScheduler.step).
    Changes nothing: the step batcher may retry a step."""
    from diffusers.pipelines.ltx2.pipeline_ltx2 import rescale_noise_cfg

    g, i = run.guidance, run.step
    sigma, sigma_next = run.sigmas[i], run.sigmas[i + 1]
    new = []
    for m, x in enumerate((run.latents, run.audio)):
        seen = model_input(run) if m == 0 else x  # what the passes predicted from
        scales = (
            (g.cfg, g.stg, g.modality, g.rescale)
            if m == 0
            else (g.audio_cfg, g.audio_stg, g.audio_modality, g.audio_rescale)
        )
        cond = seen - outs["cond"][m] * sigma
        if g.do_cfg:
            uncond, cond = cond.chunk(2)
            guided = cond + (scales[0] - 1) * (cond - uncond)
        else:
            guided = cond
        if g.do_stg:
            guided = guided + scales[1] * (cond - (seen - outs["stg"][m] * sigma))
        if g.do_modality:
            guided = guided + (scales[2] - 1) * (cond - (seen - outs["modality"][m] * sigma))
        if scales[3] > 0:
            guided = rescale_noise_cfg(guided, cond, guidance_rescale=scales[3])
        if m == 0 and run.held is not None and run.clean is not None:
            held = run.held.unsqueeze(-1)
            guided = guided * (1 - held) + run.clean * held
        velocity = (x - guided) / sigma
        new.append((x.to(torch.float32) + (sigma_next - sigma) * velocity).to(velocity.dtype))
    latents, audio = new
    if run.held is not None:  # a token held at strength 1 stays its clean latents
        latents = torch.where(run.held.unsqueeze(-1) >= 1, run.latents, latents)
    return latents, audio


def advance(run: Ltx2Run, outs: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Mix the passes' predictions and take the Euler step (`guided_step`), in place."""
    run.latents, run.audio = guided_step(run, outs)
    run.step += 1


def denoise(transformer: Any, runs: list[Ltx2Run]) -> None:
    """Every step of same-size `runs` (batched per pass)."""
    while runs[0].step < len(runs[0].timesteps):
        passes = {kind: forward(transformer, runs, kind) for kind in runs[0].guidance.passes()}
        for n, run in enumerate(runs):
            advance(run, {kind: outs[n] for kind, outs in passes.items()})


def decode(components: dict[str, Any], run: Ltx2Run) -> tuple[np.ndarray, np.ndarray, int]:
    """(frames [F, H, W, 3] uint8, audio [channels, n] float32, sample rate) of a finished run."""
    from diffusers.pipelines.ltx2.pipeline_ltx2 import LTX2Pipeline

    tcfg = components["transformer"].config
    latents = LTX2Pipeline._unpack_latents(
        run.latents, run.frames, run.height, run.width, tcfg.patch_size, tcfg.patch_size_t
    )
    return decode_av(components, latents.to(run.video_embeds.dtype), run.audio, run.audio_frames)


def decode_av(
    components: dict[str, Any], latents: torch.Tensor, audio: torch.Tensor, audio_frames: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """(frames [F, H, W, 3] uint8, audio [channels, n] float32, sample rate) of normalised video
    latents [1, C, F', h, w] and packed audio latents [1, L, C·M] of `audio_frames` frames."""
    from diffusers.pipelines.ltx2.pipeline_ltx2 import LTX2Pipeline
    from diffusers.video_processor import VideoProcessor

    vae, audio_vae, vocoder = components["vae"], components["audio_vae"], components["vocoder"]
    if vae.config.timestep_conditioning:
        raise NotImplementedError("LTX-2 VAEs with timestep conditioning are not supported yet")
    latents = LTX2Pipeline._denormalize_latents(
        latents, vae.latents_mean, vae.latents_std, vae.config.scaling_factor
    )
    mel = audio_vae.config.mel_bins // audio_vae.mel_compression_ratio
    audio = LTX2Pipeline._denormalize_audio_latents(audio, audio_vae.latents_mean, audio_vae.latents_std)
    audio = LTX2Pipeline._unpack_audio_latents(audio, audio_frames, num_mel_bins=mel)
    with torch.no_grad():
        video = vae.decode(latents.to(vae.dtype), None, return_dict=False)[0]
        spectrogram = audio_vae.decode(audio.to(audio_vae.dtype), return_dict=False)[0]
        wave = vocoder(spectrogram)
    video_np = VideoProcessor(vae_scale_factor=vae.spatial_compression_ratio).postprocess_video(
        video, output_type="np"
    )[0]
    frames = (video_np * 255).round().astype(np.uint8)
    rate = int(vocoder.config.output_sampling_rate)
    return frames, wave[0].float().numpy(), rate


def to_video(components: dict[str, Any], run: Ltx2Run) -> Any:
    """A finished run as the `video` port's value (workers/models/values.py `Video`): its frames
    at the run's frame rate with the vocoder's sound track."""
    from workers.models.values import Audio, Frames, Video

    frames, audio, rate = decode(components, run)
    return Video(Frames(frames), run.fps, Audio(audio, rate))
