"""LTX-2's side of the family contract (workers/models/family.py `FamilyPlugin`).

LTX-2 loads as one diffusers LTX2Pipeline folder from `checkpoints/` (`load/checkpoint`): the
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
# the pipeline's components of each loaded transformer (the sampler reads its VAEs' ratios)
_components: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()

__all__ = ["decode_latents_batch", "encode_image", "encode_prompts", "load_checkpoint",
           "load_diffusion_model", "load_text_encoder", "load_vae", "lora_state_dict",
           "model_sampling", "predict", "renoise", "schedule", "to_denoised", "write_tiny_stack"]


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
    """The LTX2Pipeline folder `checkpoints/<name>` as (model, text encoder, VAE) (cached)."""
    from workers.models.cache import MODEL_CACHE
    from workers.models.catalog import file_sha256, resolve
    from workers.models.ltx2.loading import load_folder
    from workers.models.values import Vae
    from workers.models.weights import denoiser_model, refuse_int8, text_encoder_model

    path = resolve(models_dir, "checkpoints", name)
    refuse_int8(policy)
    sha, placement = file_sha256(path), policy.placement("denoiser")

    def load() -> tuple[Any, Any, Any]:
        components = dict(load_folder(path))
        for key, module in components.items():
            moves = (placement.device, placement.dtype) != ("cpu", "float32")  # loaded so
            if moves and hasattr(module, "to") and hasattr(module, "parameters"):
                components[key] = module.to(placement.device, placement.torch_dtype)
        transformer = components["transformer"]
        _components[transformer] = components
        model = denoiser_model(name=name, sha=sha, transformer=transformer, predict=predict,
                               placement=placement, policy=policy, family=FAMILY)
        encoder = text_encoder_model(name=name, sha=sha, model=components,
                                     tokenizer=components["tokenizer"], placement=placement,
                                     policy=policy, encode=encode_prompts, family=FAMILY)
        return model, encoder, Vae(name, sha, components, placement, family=FAMILY)

    return MODEL_CACHE.get_or_load(("ltx2-checkpoint", sha, placement, policy.attention), load)


def components_of(transformer: Any) -> dict[str, Any]:
    """The pipeline components a loaded LTX-2 transformer came with."""
    return _components[transformer]


def _folder_only(what: str) -> ModelLoadError:
    return ModelLoadError(f"{what}: LTX-2 loads as a whole diffusers LTX2Pipeline folder from "
                          "checkpoints/ (load/checkpoint); its single files are not supported yet")


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
    rows of `jobs`: one call per pass for each group of jobs of one clip size and guidance;
    each job's {pass: (video velocity, audio velocity)}."""
    from workers.models.ltx2.engine import forward
    from workers.sampling.batcher import FORWARD_JOBS

    views = [_view(job) for job in jobs]
    groups: dict[tuple[Any, ...], list[int]] = {}
    for n, run in enumerate(views):
        key = (run.frames, run.height, run.width, run.audio_frames, run.fps,
               run.guidance.passes(), run.guidance.stg_blocks, tuple(run.video_embeds.shape[1:]))
        groups.setdefault(key, []).append(n)
    outs: list[dict[str, Any]] = [{} for _ in jobs]
    for members in groups.values():
        runs = [views[n] for n in members]
        for kind in runs[0].guidance.passes():
            for n, out in zip(members, forward(transformer, runs, kind), strict=True):
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
    return _unpack(job, latents)


def _view(job: Any) -> Any:
    """The job's run (engine.Ltx2Run) at its current step."""
    from diffusers.pipelines.ltx2.pipeline_ltx2 import LTX2Pipeline

    ps, pt = job.extra[PATCH]
    return replace(job.extra[RUN], latents=LTX2Pipeline._pack_latents(job.latents, ps, pt),
                   audio=job.extra[AUDIO][job.step], step=job.step)


def _unpack(job: Any, latents: Any) -> Any:
    from diffusers.pipelines.ltx2.pipeline_ltx2 import LTX2Pipeline

    run, (ps, pt) = job.extra[RUN], job.extra[PATCH]
    return LTX2Pipeline._unpack_latents(latents, run.frames, run.height, run.width, ps, pt)


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
    raise ValueError(f"{path.name}: LTX-2 LoRAs are not supported yet")


def write_tiny_stack(models_dir: Path) -> dict[str, str]:
    from workers.models.ltx2 import tiny

    return tiny.write_tiny_stack(models_dir)
