"""MiniMax-H3's side of the family contract (workers/models/family.py `FamilyPlugin`).

MiniMax-H3 loads whole: one diffusers MiniMax-H3 folder from `checkpoints/` (`load/checkpoint`),
or ComfyUI's four parts together (`minimaxh3/load-files`). The model is its transformer (with
the step batcher); the text encoder and the VAE values both hold the stack's `engine.Parts` (the
Qwen3-VL encodes keyframes with the prompt; the video VAE encodes them, and decodes the clip with
the audio VAE). It samples with `minimaxh3/sample` (workers/models/minimaxh3/nodes.py): its
packed video + audio + text sequence and its two schedules are not the generic sampler's, but
its jobs run on the step batcher.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from workers.models.family import ModelLoadError

FAMILY = "minimaxh3"
RUN, AUDIO, PATCH = "minimaxh3_run", "minimaxh3_audio", "minimaxh3_patch"  # SampleJob `extra` keys
# the stack (engine.Parts) of each loaded transformer (the sampler reads its VAEs' channels)
_parts: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()

__all__ = ["advance", "decode_latents_batch", "encode_image", "encode_prompts", "load_checkpoint",
           "load_diffusion_model", "load_files", "load_text_encoder", "load_vae", "lora_state_dict",
           "model_sampling", "parts_of", "predict", "renoise", "schedule", "to_denoised", "write_tiny_stack"]


@dataclass(frozen=True, eq=False)
class Prompt:
    """One text's conditioning: Qwen3-VL's hidden state after layer 50 [1, L, D] and its rows'
    modality tags [L] (a prompt alone: every row text), encoded with `keyframes` images."""

    embeds: Any
    tags: Any
    keyframes: int = 0

    def to(self, device: Any) -> Prompt:
        return Prompt(self.embeds.to(device), self.tags, self.keyframes)


def load_checkpoint(models_dir: Path, name: str, policy: Any) -> tuple[Any, Any, Any]:
    """`checkpoints/<name>` (a diffusers MiniMax-H3 folder) as (model, text encoder, VAE),
    placed as the policy says (cached)."""
    from workers.models.catalog import file_sha256, resolve
    from workers.models.minimaxh3.loading import load_folder
    from workers.models.weights import refuse_int8

    path = resolve(models_dir, "checkpoints", name)
    refuse_int8(policy)
    if not path.is_dir():
        raise ModelLoadError(f"{name}: MiniMax-H3 loads from a diffusers folder in checkpoints/ "
                             "(transformer/, vae/, audio_vae/, text_encoder/, tokenizer/)")
    return _values(name, file_sha256(path), policy, lambda: load_folder(path))


def load_files(models_dir: Path, names: dict[str, str], policy: Any) -> tuple[Any, Any, Any]:
    """ComfyUI's four separate parts (`names` by loading.FILE_ROLES: diffusion_models/, vae/
    twice, text_encoders/) as (model, text encoder, VAE), as load_checkpoint gives them
    (cached)."""
    import hashlib

    from workers.models.catalog import file_sha256, resolve
    from workers.models.minimaxh3.loading import FILE_ROLES
    from workers.models.minimaxh3.loading import load_files as load
    from workers.models.weights import refuse_int8

    folders = {"diffusion_model": "diffusion_models", "vae": "vae", "audio_vae": "vae",
               "text_encoder": "text_encoders"}
    paths = {role: resolve(models_dir, folders[role], names[role]) for role in FILE_ROLES}
    refuse_int8(policy)
    sha = hashlib.sha256("\0".join(file_sha256(paths[r]) for r in FILE_ROLES).encode()).hexdigest()
    return _values(names["diffusion_model"], sha, policy, lambda: load(paths))


def _values(name: str, sha: str, policy: Any, load_parts: Any) -> tuple[Any, Any, Any]:
    """(model, text encoder, VAE) over the stack `load_parts()` loads, placed as the policy
    says, cached by `sha`."""
    from workers.models.cache import MODEL_CACHE
    from workers.models.values import Vae
    from workers.models.weights import denoiser_model, text_encoder_model

    placement = policy.placement("denoiser")

    def load() -> tuple[Any, Any, Any]:
        parts = load_parts()
        if (placement.device, placement.dtype) != ("cpu", "float32"):  # loaded so
            for part in ("transformer", "vae", "audio_vae", "text_encoder"):
                setattr(parts, part, getattr(parts, part).to(placement.device,
                                                             placement.torch_dtype))
        _parts[parts.transformer] = parts
        model = denoiser_model(name=name, sha=sha, transformer=parts.transformer, predict=predict,
                               placement=placement, policy=policy, family=FAMILY)
        encoder = text_encoder_model(name=name, sha=sha, model=parts, tokenizer=parts.tokenizer,
                                     placement=placement, policy=policy, encode=encode_prompts,
                                     family=FAMILY)
        return model, encoder, Vae(name, sha, parts, placement, family=FAMILY)

    return MODEL_CACHE.get_or_load(("minimaxh3-checkpoint", sha, placement, policy.attention), load)


def parts_of(transformer: Any) -> Any:
    """The stack (engine.Parts) a loaded MiniMax-H3 transformer came with."""
    return _parts[transformer]


def _whole(what: str) -> ModelLoadError:
    return ModelLoadError(f"{what}: MiniMax-H3 loads whole (its transformer needs both its VAEs "
                          "and its Qwen3-VL): a diffusers MiniMax-H3 folder from checkpoints/ "
                          "(load/checkpoint), or its four parts together (minimaxh3/load-files)")


def load_diffusion_model(models_dir: Path, name: str, policy: Any) -> Any:
    """Refused: ComfyUI's single-file transformer is read (loading.load_transformer_file, which
    names a quantized or pruned file), but the family runs from its folder."""
    from workers.models.catalog import resolve
    from workers.models.minimaxh3.loading import load_transformer_file

    path = resolve(models_dir, "diffusion_models", name)
    if path.is_file():
        load_transformer_file(path)  # a quantized or pruned file: refused by name
    raise _whole(name)


def load_vae(models_dir: Path, name: str, policy: Any) -> Any:
    raise _whole(name)


def load_text_encoder(models_dir: Path, names: Sequence[str], policy: Any) -> Any:
    raise _whole(" + ".join(names))


def encode_prompts(encoder: Any, texts: list[str]) -> list[Prompt]:
    """Each text's `Prompt` (MiniMax-H3's encode of a prompt without keyframes; with keyframes,
    minimaxh3/image-to-video encodes the prompt and its images together)."""
    from workers.models.minimaxh3.engine import encode_prompt

    return [Prompt(*encode_prompt(encoder.model, text)) for text in texts]


def predict(transformer: Any, jobs: list[Any]) -> list[tuple[Any, Any]]:
    """The transformer's (video, audio) velocities of each job: one call per job (each run's
    packed sequence has its own length and layout), with the job's LoRAs."""
    from workers.models.lora import rows as lora_rows
    from workers.models.minimaxh3.engine import forward
    from workers.sampling.batcher import FORWARD_JOBS

    outs = []
    for job in jobs:
        with lora_rows([job.loras]):
            outs.append(forward(transformer, _view(job)))
        job.extra[FORWARD_JOBS] = 1
    return outs


def advance(job: Any, outs: tuple[Any, Any]) -> Any:
    """The job's next video latents [1, C, F, h, w] after MiniMax-H3's Euler step (its audio
    rows go to its `extra`, by step: a retried step writes the same)."""
    from workers.models.minimaxh3.engine import stepped, unpatchify

    run = _view(job)
    video, audio = stepped(run, outs)
    steps = job.extra[AUDIO]
    steps[job.step + 1] = audio
    for old in [s for s in steps if s < job.step]:
        del steps[old]
    return unpatchify(run.size, video[run.held:], job.latents.shape[1], job.extra[PATCH])


def _view(job: Any) -> Any:
    """The job's run (engine.H3Run) at its current step: its held keyframe rows, then its
    latents as packed rows."""
    import torch
    from diffusers.modular_pipelines.minimax_h3.before_denoise import patchify_video_latents

    run = job.extra[RUN]
    rows = patchify_video_latents(job.latents, job.extra[PATCH])
    return replace(run, video=torch.cat([run.video[:run.held], rows]),
                   audio=job.extra[AUDIO][job.step], step=job.step)


def _generic(what: str) -> Exception:
    from workers.runners.base import NodeFailed

    return NodeFailed(f"MiniMax-H3 {what}: use the minimaxh3/* nodes (minimaxh3/image-to-video, "
                      "minimaxh3/sample, minimaxh3/decode)")


def schedule(steps: int, width: int, height: int, denoise: float,
             shift: float | None = None) -> tuple[Any, Any]:
    raise _generic("samples its video and audio together with minimaxh3/sample, not sample")


def renoise(init: Any, eps: Any, sigma: Any) -> Any:
    raise _generic("has no image-to-image through sample")


def encode_image(vae: Any, image: Any, generator: Any = None) -> Any:
    raise _generic("conditions on first / last frames with minimaxh3/image-to-video, not "
                   "vae/encode")


def decode_latents_batch(vae: Any, latents: list[Any]) -> list[Any]:
    raise _generic("clips decode with minimaxh3/decode, not vae/decode")


def to_denoised(job: Any, output: Any) -> Any:
    raise _generic("has no generic samplers (its video and audio step on two schedules)")


def model_sampling(width: int, height: int, shift: float | None = None) -> Any:
    raise _generic("has no generic samplers or schedulers")


def lora_state_dict(path: Path, denoiser: Any) -> dict[str, Any]:
    """{transformer module: (A, B, scale)} of a MiniMax-H3 LoRA file in any format diffusers'
    MiniMaxH3LoraLoaderMixin reads (its converter of the original keys, diffusers / PEFT)."""
    from diffusers.loaders.lora_pipeline import MiniMaxH3LoraLoaderMixin

    from workers.models.lora import pipeline_lora_modules

    return pipeline_lora_modules(MiniMaxH3LoraLoaderMixin, path)


def write_tiny_stack(models_dir: Path) -> dict[str, str]:
    """`checkpoints/smoke-minimaxh3/`: the tiny stack as a diffusers MiniMax-H3 folder (`./farm
    models smoke`)."""
    from workers.models.minimaxh3 import tiny

    tiny.write_folder(models_dir / "checkpoints" / tiny.SMOKE)
    return {"checkpoint": tiny.SMOKE}
