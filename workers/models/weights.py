"""Loading weights the same way in every family: offline, checked complete, errors naming the
file and the folder it belongs in, CPU weights in memory of their own."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from workers.device.policy import DevicePolicy, Placement
from workers.models.catalog import WEIGHT_SUFFIXES
from workers.models.family import ModelLoadError


def sidecar(path: Path, suffix: str) -> Path:
    """`<folder>/<stem><suffix>` beside a weight file (stem = name without its weight suffix)."""
    stem = path.name
    for weight_suffix in WEIGHT_SUFFIXES:
        if stem.lower().endswith(weight_suffix):
            stem = stem[: -len(weight_suffix)]
            break
    return path.with_name(stem + suffix)


def load_weights(cls: Any, path: Path, placement: Placement, config: Path, what: str,
                 folder: str) -> Any:
    """`cls` from a diffusers folder, or from a single file built with `config` (a config.json);
    checked complete."""
    dtype = placement.torch_dtype
    with load_errors(path, what, folder):
        if path.is_dir():
            model = cls.from_pretrained(path, local_files_only=True, torch_dtype=dtype)
        else:
            model = cls.from_single_file(str(path), config=str(config),
                                         local_files_only=True, torch_dtype=dtype)
        check_complete(model, path)
    return model


def check_complete(model: Any, path: Path) -> None:
    """Refuse a model whose file left weights unset (still on the meta device)."""
    empty = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if empty:
        raise ModelLoadError(
            f"{path.name} does not hold every weight the config asks for (e.g. {empty[:3]}); "
            "is the file complete, and is its config right?"
        )


def own_storage(model: Any) -> None:
    """Copy every weight into fresh, aligned, contiguous memory (CPU loads).

    Weights loaded from a file are views into its (mmapped) buffer: unfused ComfyUI `qkv`
    parts sit at offsets, and buffer alignment varies by file. CPU matmul kernels round
    differently on such memory (~5e-7), so the same weights would not give the same image from
    two files. Moving to a GPU copies anyway; on CPU we copy, one tensor at a time.
    """
    with torch.no_grad():
        for param in model.parameters():
            param.data = param.data.clone(memory_format=torch.contiguous_format)


def rest(model: Any, placement: Placement) -> Any:
    """Where a model waits between uses: CPU when offloaded, its device otherwise."""
    if placement.device == "cpu" or placement.offload:
        own_storage(model)
    return model.to("cpu" if placement.offload else placement.device).eval()


def refuse_int8(policy: DevicePolicy) -> None:
    if policy.int8:
        raise ModelLoadError("int8 weights are not supported by this worker yet (policy.int8)")


@contextmanager
def load_errors(path: Path, what: str, folder: str) -> Iterator[None]:
    """Turn any loader exception into a ModelLoadError naming the file and its folder."""
    try:
        yield
    except ModelLoadError:
        raise
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
        if "meta tensor" in str(exc):
            # from_single_file leaves weights the file lacks on the meta device, then fails to
            # move them (before _check_complete can look): say what that means.
            reason = "the file does not hold every weight its config asks for (incomplete file?)"
        raise ModelLoadError(
            f"cannot load {path.name} as {what} (it belongs in the models dir's {folder}/ "
            f"folder; for a single file, its config goes in "
            f"{sidecar(path, '.config.json').name} beside it): {reason}"
        ) from exc


def denoiser_model(*, name: str, sha: str, transformer: Any, predict: Any, placement: Placement,
                   policy: DevicePolicy, family: Any) -> Any:
    """A loaded transformer as the farm's DiffusionModel: the policy's attention backend, and
    its step batcher — one `predict(transformer, jobs)` forward over the ready jobs of every
    slot, bounded by the policy, counted for the heartbeat. Every family's loader ends here."""
    from workers.counters import count, forwards_observer
    from workers.models.values import DiffusionModel
    from workers.sampling import StepBatcher

    count("denoiser_loads")  # the heartbeat's proof that LoRAs never reload the base

    if policy.attention != "native":
        transformer.set_attention_backend(policy.attention)
    bounds = policy.batch_bounds()
    batcher = StepBatcher(lambda jobs: predict(transformer, jobs), bounds.items, bounds.tokens,
                          observe=forwards_observer())
    return DiffusionModel(name, sha, transformer, batcher, placement, family)


def vae_model(*, name: str, sha: str, module: Any, placement: Placement, policy: DevicePolicy,
              decode: Any, latent: Any, family: Any) -> Any:
    """A loaded AutoencoderKL as the farm's Vae: tiled / sliced when the policy says so, with
    its coalescer of decodes — `decode(vae, latents)` (the family's `decode_latents_batch`) over
    same-size latents of every slot, bounded by the policy (cost: `latent`'s tokens), counted
    for the heartbeat. Every family's VAE loader ends here."""
    from workers.counters import batcher_observer
    from workers.models.values import Vae
    from workers.sampling.coalesce import Coalescer

    if policy.vae_tiling:
        module.enable_tiling()
    if policy.vae_slicing:
        module.enable_slicing()
    vae = Vae(name, sha, module, placement, family=family)
    bounds = policy.batch_bounds()
    decoder: Coalescer[Any, Any] = Coalescer(
        lambda latents: decode(vae, latents), max_items=bounds.items, max_cost=bounds.tokens,
        cost=lambda x: latent.tokens(int(x.shape[-2]), int(x.shape[-1])),
        key=lambda latents: tuple(latents.shape), observe=batcher_observer("vae_decodes"))
    return Vae(name, sha, module, placement, decoder, family)


def text_encoder_model(*, name: str, sha: str, model: Any, tokenizer: Any, placement: Placement,
                       policy: DevicePolicy, encode: Any, family: Any) -> Any:
    """A loaded text encoder (or a family's tuple of them) as the farm's TextEncoder, with its
    coalescer of encodes — `encode(encoder, texts)` (the family's `encode_prompts`) over the
    (text, LoRAs) requests of every slot, each text's rows with its own text-encoder LoRAs,
    bounded by the policy, counted for the heartbeat. Every family's encoder loader ends here."""
    from workers.counters import batcher_observer
    from workers.models.lora import encode_rows
    from workers.models.values import TextEncoder
    from workers.sampling.coalesce import Coalescer

    te = TextEncoder(name, sha, model, tokenizer, placement, family=family)
    batched: Coalescer[Any, Any] = Coalescer(
        lambda items: encode_rows(encode, te, items), max_items=policy.batch_bounds().items,
        observe=batcher_observer("text_encodes"))
    return TextEncoder(name, sha, model, tokenizer, placement, batched, family)
