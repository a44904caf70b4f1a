"""LTX-2's side of the family contract (workers/models/family.py `FamilyPlugin`).

LTX-2 loads as one diffusers LTX2Pipeline folder, or ComfyUI's all-in-one file with its configs,
from `checkpoints/` (`load/checkpoint`), or as ComfyUI's four separate files (`ltx2/load-files`,
workers/models/ltx2/files.py): the
model is its audio-video transformer (with the step batcher), the text encoder its Gemma3 +
tokenizer + text connectors, the VAE its video VAE + audio VAE + vocoder (each value's module is
the pipeline's components dict). It samples with `ltx2/sample` (workers/models/ltx2/nodes.py):
its passes (CFG, STG, modality isolation) and its audio latents are not the generic sampler's, but
its jobs run on the same step batcher, so runs of one size share every transformer call.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from workers.models.family import ModelLoadError

FAMILY = "ltx2"
MAX_SEQUENCE = 1024  # LTX2Pipeline's max_sequence_length (less when the Gemma3 holds fewer)
RUN, AUDIO, PATCH = "ltx2_run", "ltx2_audio", "ltx2_patch"  # a SampleJob's `extra` keys
# more `extra` keys: the video VAE (for previews) and the last step's middle-frame x0 estimate
PREVIEW_VAE, PREVIEW_X0 = "ltx2_preview_vae", "ltx2_preview_x0"
PREVIEW_CELLS = 4  # the preview fit's images: 4 × 4 latent pixels each
# the pipeline's components of each loaded transformer (the sampler reads its VAEs' ratios)
_components: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()

__all__ = ["decode_latents_batch", "encode_image", "encode_prompts", "load_checkpoint",
           "load_diffusion_model", "load_files", "load_text_encoder", "load_vae", "lora_state_dict",
           "model_sampling", "predict", "preview_pixels", "renoise", "schedule",
           "text_encoder_lora_state_dict", "text_encoder_parts", "to_denoised", "write_tiny_stack"]
_preview_fits: weakref.WeakKeyDictionary[Any, tuple[Any, Any]] = weakref.WeakKeyDictionary()


@dataclass(frozen=True, eq=False)
class Prompt:
    """One text's conditioning: the connectors' video and audio embeds [1, S, D] and the
    Gemma3 attention mask [1, S]."""

    video: Any
    audio: Any
    mask: Any

    def to(self, device: Any) -> Prompt:
        return Prompt(self.video.to(device), self.audio.to(device), self.mask.to(device))


def load_checkpoint(models_dir: Path, name: str, policy: Any) -> tuple[Any, Any, Any]:
    """`checkpoints/<name>` as (model, text encoder, VAE) (cached): an LTX2Pipeline folder, or
    ComfyUI's all-in-one file with its `<stem>.diffusers/` configs (loading.py)."""
    from workers.models.catalog import resolve
    from workers.models.ltx2.loading import load_folder, load_single_file
    from workers.models.weights import refuse_int8

    path = resolve(models_dir, "checkpoints", name)
    refuse_int8(policy)
    return _values(name, checkpoint_sha256(path), policy, lambda: dict(
        load_folder(path) if path.is_dir() else load_single_file(path)))


def load_files(models_dir: Path, names: dict[str, str], policy: Any) -> tuple[Any, Any, Any]:
    """ComfyUI's separate files (`names` by files.ROLES: diffusion_models/, vae/ twice,
    text_encoders/) as (model, text encoder, VAE), as load_checkpoint gives them (cached)."""
    import hashlib

    from workers.models.catalog import resolve
    from workers.models.ltx2.files import FOLDERS, ROLES
    from workers.models.ltx2.files import load_files as load
    from workers.models.weights import refuse_int8

    paths = {role: resolve(models_dir, FOLDERS[role], names[role]) for role in ROLES}
    refuse_int8(policy)
    sha = hashlib.sha256("\0".join(checkpoint_sha256(paths[r]) for r in ROLES).encode()).hexdigest()
    return _values(names["diffusion_model"], sha, policy, lambda: dict(load(paths)))


def _values(name: str, sha: str, policy: Any, components: Any) -> tuple[Any, Any, Any]:
    """(model, text encoder, VAE) over the pipeline components `components()` loads, placed
    as the policy says, cached by `sha`."""
    from workers.models.cache import MODEL_CACHE
    from workers.models.values import Vae
    from workers.models.weights import denoiser_model, text_encoder_model

    placement = policy.placement("denoiser")

    def load() -> tuple[Any, Any, Any]:
        loaded = components()
        for key, module in loaded.items():
            moves = (placement.device, placement.dtype) != ("cpu", "float32")  # loaded so
            if moves and hasattr(module, "to") and hasattr(module, "parameters"):
                loaded[key] = module.to(placement.device, placement.torch_dtype)
        transformer = loaded["transformer"]
        _components[transformer] = loaded
        model = denoiser_model(name=name, sha=sha, transformer=transformer, predict=predict,
                               placement=placement, policy=policy, family=FAMILY)
        encoder = text_encoder_model(name=name, sha=sha, model=loaded,
                                     tokenizer=loaded["tokenizer"], placement=placement,
                                     policy=policy, encode=encode_prompts, family=FAMILY)
        return model, encoder, Vae(name, sha, loaded, placement, family=FAMILY)

    return MODEL_CACHE.get_or_load(("ltx2-checkpoint", sha, placement, policy.attention), load)


def checkpoint_sha256(path: Path) -> str:
    """The checkpoint's identity (lineage, caches): a folder's manifest hash; for the single
    file, its hash with its `<stem>.diffusers/` folder's (which holds the Gemma 3 weights and
    every config: changing them changes the clip)."""
    import hashlib

    from workers.models.catalog import file_sha256
    from workers.models.weights import sidecar

    configs = sidecar(path, ".diffusers")
    if path.is_dir() or not configs.is_dir():
        return file_sha256(path)
    return hashlib.sha256(f"{file_sha256(path)}\0{file_sha256(configs)}".encode()).hexdigest()


def components_of(transformer: Any) -> dict[str, Any]:
    """The pipeline components a loaded LTX-2 transformer came with."""
    return _components[transformer]


def _folder_only(what: str) -> ModelLoadError:
    return ModelLoadError(f"{what}: LTX-2 loads whole (its transformer needs its VAEs and text "
                          "encoder): from checkpoints/ (load/checkpoint: a diffusers "
                          "LTX2Pipeline folder or ComfyUI's all-in-one file with its "
                          "<stem>.diffusers/ configs), or its separate diffusion model, video "
                          "VAE, audio VAE and text encoder files together (ltx2/load-files)")


def load_diffusion_model(models_dir: Path, name: str, policy: Any) -> Any:
    raise _folder_only(name)


def load_vae(models_dir: Path, name: str, policy: Any) -> Any:
    raise _folder_only(name)


def load_text_encoder(models_dir: Path, names: Sequence[str], policy: Any) -> Any:
    raise _folder_only(" + ".join(names))


def sequence_length(components: dict[str, Any]) -> int:
    """The prompt tokens: the pipeline's 1024, fewer when the Gemma3 has fewer positions."""
    config = components["text_encoder"].config
    positions = getattr(getattr(config, "text_config", config), "max_position_embeddings", None)
    return min(MAX_SEQUENCE, int(positions or MAX_SEQUENCE))


def encode_prompts(encoder: Any, texts: list[str]) -> list[Prompt]:
    """Each text's `Prompt`, from one Gemma3 + connectors call (LTX2Pipeline's encode)."""
    from workers.models.ltx2.engine import encode_prompts as encode

    components = encoder.model
    video, audio, mask = encode(components, texts, sequence_length(components))
    return [Prompt(video[i:i + 1], audio[i:i + 1], mask[i:i + 1]) for i in range(len(texts))]


def predict(transformer: Any, jobs: list[Any]) -> list[dict[str, Any]]:
    """The transformer's passes (cond, then STG / modality as the jobs' guidance asks) over the
    rows of `jobs`: one call per pass for each group of jobs of one clip size, guide frames
    (their tokens' positions) and guidance; each job's {pass: (video velocity, audio
    velocity)}."""
    from workers.models.lora import rows as lora_rows
    from workers.models.ltx2.engine import forward
    from workers.sampling.batcher import FORWARD_JOBS

    views = [_view(job) for job in jobs]
    groups: dict[tuple[Any, ...], list[int]] = {}
    for n, run in enumerate(views):
        key = (run.frames, run.height, run.width, run.audio_frames, run.fps, run.guide_frames,
               run.guidance.passes(), run.guidance.stg_blocks, tuple(run.video_embeds.shape[1:]))
        groups.setdefault(key, []).append(n)
    outs: list[dict[str, Any]] = [{} for _ in jobs]
    for members in groups.values():
        runs = [views[n] for n in members]
        for kind in runs[0].guidance.passes():
            # a CFG job's cond pass has its two rows, each carrying its LoRAs; the others one
            per_row = [jobs[n].loras for n in members
                       for _ in range(views[n].video_embeds.shape[0] if kind == "cond" else 1)]
            with lora_rows(per_row):
                found = forward(transformer, runs, kind)
            for n, out in zip(members, found, strict=True):
                outs[n][kind] = out
        for n in members:
            jobs[n].extra[FORWARD_JOBS] = len(members)
    return outs


def advance(job: Any, outs: dict[str, Any]) -> Any:
    """The job's next video latents [1, C, F', h, w] (its audio latents go to its `extra`, by
    step: a retried step writes the same)."""
    from workers.models.ltx2.engine import guided_step

    run = _view(job)
    latents, audio = guided_step(run, outs)
    steps = job.extra[AUDIO]
    steps[job.step + 1] = audio
    for old in [s for s in steps if s < job.step]:
        del steps[old]
    out = _unpack(job, latents)
    # the middle latent frame's x0 estimate (x − σ·v, v the step's guided velocity), for a preview
    x, y, middle = job.latents, out, job.extra[RUN].frames // 2  # a clip frame, not a guide's
    sigma, sigma_next = job.sigmas[job.step], job.sigmas[job.step + 1]
    x_mid = x[:, :, middle].float()
    job.extra[PREVIEW_X0] = x_mid - sigma * (y[:, :, middle].float() - x_mid) / (sigma_next - sigma)
    return out


def preview_pixels(job: Any) -> Any:
    """A live preview of an `ltx2/sample` job (device thread): its middle latent frame's x0
    estimate after the last step through a linear latent → RGB map fitted on the video VAE (as
    workers/models/preview.py does for the image families), at latent resolution (1/32 side);
    uint8 numpy [h, w, 3], or None before the first step."""
    import torch

    x0, vae = job.extra.get(PREVIEW_X0), job.extra.get(PREVIEW_VAE)
    if x0 is None or vae is None:
        return None
    weights, bias = _preview_fit(vae)
    rgb = torch.einsum("chw,ck->hwk", x0[0].float().cpu(), weights) + bias
    return ((rgb.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).numpy()


def _preview_fit(vae: Any) -> tuple[Any, Any]:
    """(weights [C, 3], bias [3]) mapping a normalised LTX-2 video latent pixel to RGB in
    [-1, 1]: least squares over colour fields encoded as one-frame clips; cached per VAE."""
    import torch
    from diffusers.pipelines.ltx2.pipeline_ltx2 import LTX2Pipeline

    if vae in _preview_fits:
        return _preview_fits[vae]
    ratio, channels = vae.spatial_compression_ratio, vae.config.latent_channels
    count = max(8, channels // PREVIEW_CELLS ** 2 + 2)  # more samples than unknowns
    generator = torch.Generator("cpu").manual_seed(0)
    blocks = torch.rand(count, 3, PREVIEW_CELLS, PREVIEW_CELLS, generator=generator) * 2 - 1
    images = torch.nn.functional.interpolate(blocks, size=(PREVIEW_CELLS * ratio,) * 2,
                                             mode="bilinear")
    with torch.no_grad():
        pixels = images.unsqueeze(2).to(device=vae.device, dtype=vae.dtype)
        latents = LTX2Pipeline._normalize_latents(
            vae.encode(pixels).latent_dist.mode(), vae.latents_mean, vae.latents_std,
            vae.config.scaling_factor)[:, :, 0].float().cpu()  # [N, C, 4, 4]
    x = latents.permute(0, 2, 3, 1).reshape(-1, channels)
    x = torch.cat([x, torch.ones(len(x), 1)], dim=1)
    y = torch.nn.functional.avg_pool2d(images, ratio).permute(0, 2, 3, 1).reshape(-1, 3)
    solution = torch.linalg.lstsq(x, y).solution
    _preview_fits[vae] = (solution[:-1], solution[-1])
    return _preview_fits[vae]


def _view(job: Any) -> Any:
    """The job's run (engine.Ltx2Run) at its current step."""
    from diffusers.pipelines.ltx2.pipeline_ltx2 import LTX2Pipeline

    ps, pt = job.extra[PATCH]
    return replace(job.extra[RUN], latents=LTX2Pipeline._pack_latents(job.latents, ps, pt),
                   audio=job.extra[AUDIO][job.step], step=job.step)


def _unpack(job: Any, latents: Any) -> Any:
    from diffusers.pipelines.ltx2.pipeline_ltx2 import LTX2Pipeline

    run, (ps, pt) = job.extra[RUN], job.extra[PATCH]
    frames = run.frames + len(run.guide_frames)  # the guides' frames after the clip's
    return LTX2Pipeline._unpack_latents(latents, frames, run.height, run.width, ps, pt)


def _generic(what: str) -> Exception:
    from workers.runners.base import NodeFailed

    return NodeFailed(f"LTX-2 {what}: use the ltx2/* nodes (ltx2/empty-latent, ltx2/sample, "
                      "ltx2/decode)")


def schedule(steps: int, width: int, height: int, denoise: float,
             shift: float | None = None) -> tuple[Any, Any]:
    raise _generic("samples its video and audio together with ltx2/sample, not sample")


def renoise(init: Any, eps: Any, sigma: Any) -> Any:
    raise _generic("has no image-to-image through sample")


def encode_image(vae: Any, image: Any, generator: Any = None) -> Any:
    raise _generic("conditions on an image with ltx2/image-to-video, not vae/encode")


def decode_latents_batch(vae: Any, latents: list[Any]) -> list[Any]:
    raise _generic("clips decode with ltx2/decode, not vae/decode")


def to_denoised(job: Any, output: Any) -> Any:
    raise _generic("has no generic samplers (its guidance mixes several passes)")


def model_sampling(width: int, height: int, shift: float | None = None) -> Any:
    raise _generic("has no generic samplers or schedulers yet")


def lora_state_dict(path: Path, denoiser: Any) -> dict[str, Any]:
    """{transformer module: (A, B, scale)} of an LTX-2 LoRA file in any format
    LTX2Pipeline.lora_state_dict reads (ComfyUI / Lightricks' `diffusion_model.` original keys,
    diffusers / PEFT): its converter, alphas as diffusers applies them. Weights of the text
    connectors (`text_embedding_projection.`) are left out."""
    from diffusers import LTX2Pipeline

    from workers.models.lora import pipeline_lora_modules

    return pipeline_lora_modules(LTX2Pipeline, path)


def text_encoder_parts(encoder: Any) -> dict[str, Any]:
    """The text encoder an LTX-2 LoRA may adapt: the checkpoint's Gemma 3 (diffusers'
    `text_encoder`; TextGenerateLTX2Prompt's abliterated Gemma LoRA goes on it)."""
    return {"text_encoder": encoder.model["text_encoder"]}


def text_encoder_lora_state_dict(path: Path, encoder: Any, denoiser: Any) -> dict[str, Any]:
    """{"text_encoder.model.language_model.<module>": (A, B, alpha / r)} of a LoRA file's
    Gemma 3 half in ComfyUI's keys: its generic `text_encoders.` + its Gemma's state-dict name
    (`text_encoders.gemma3_12b.transformer.model.layers.0.self_attn.q_proj.lora_A.weight`,
    `.lora_B.weight` or `.lora_down` / `.lora_up`, `.alpha`). Other text-encoder keys are
    refused (LoraMismatch): a silent half would write another prompt than the trainer's."""
    from safetensors.torch import load_file

    from workers.models.lora import LoraMismatch, peft_modules, text_encoder_keys
    from workers.models.ltx2 import GEMMA_LORA_PREFIX

    other = [k for k in text_encoder_keys(path) if not k.startswith(GEMMA_LORA_PREFIX)]
    if other:
        raise LoraMismatch(f"loras/{path.name} has text-encoder weights this farm does not "
                           f"apply to LTX-2's Gemma 3 ({other[0]}, …; it reads ComfyUI's "
                           f"{GEMMA_LORA_PREFIX}layers.… keys): set strength_clip to 0")
    state = {k.removeprefix(GEMMA_LORA_PREFIX).replace(".lora_down.", ".lora_A.")
             .replace(".lora_up.", ".lora_B."): v
             for k, v in load_file(str(path)).items() if k.startswith(GEMMA_LORA_PREFIX)}
    alphas = {k: float(v) for k, v in state.items() if k.endswith(".alpha")}
    return {f"text_encoder.model.language_model.{module}": weights
            for module, weights in peft_modules(state, alphas, "").items()}


def write_tiny_stack(models_dir: Path) -> dict[str, str]:
    """The tiny pipeline folder in checkpoints/ and the tiny latent upsampler in
    latent_upscale_models/ (`./farm models smoke`)."""
    from workers.models.ltx2 import tiny

    return {**tiny.write_tiny_stack(models_dir), **tiny.write_tiny_upsampler(models_dir)}
