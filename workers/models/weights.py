"""Loading weights the same way in every family: offline, checked complete, errors naming the
file and the folder it belongs in, CPU weights in memory of their own."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from workers.device.policy import DevicePolicy, Placement
from workers.models.cache import MODEL_CACHE
from workers.models.catalog import WEIGHT_SUFFIXES, file_sha256, resolve
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


def config_or_shipped(path: Path, configs: Path, role: str) -> Path:
    """The config.json to build a single file `path` with: its sidecar `<stem>.config.json`,
    else the family's shipped full-size one (`configs/<role>/config.json`)."""
    own = sidecar(path, ".config.json")
    return own if own.is_file() else configs / role / "config.json"


def placed_denoiser(model: Any, placement: Placement) -> Any:
    """A loaded denoiser on its device, in memory of its own on CPU (it never waits offloaded)."""
    if placement.device == "cpu":
        own_storage(model)
    return model.to(placement.device).eval()


def assign_state(cls: Any, config: Any, state: dict[str, Any], path: Path) -> Any:
    """`cls(config)` built on the meta device, its weights assigned from `state`; every key of
    the file must be one of the model's and every weight must come from it."""
    import torch

    with torch.device("meta"):
        model = cls.from_config(config)
    result = model.load_state_dict(state, strict=False, assign=True)
    if result.missing_keys or result.unexpected_keys:
        raise ModelLoadError(
            f"{path.name} does not match its config: missing {result.missing_keys[:3]}, "
            f"unexpected {result.unexpected_keys[:3]}")
    return model


def tokenizer_folder(path: Path) -> Path:
    """Where a text encoder's tokenizer lives: its own folder, or `<stem>.tokenizer/` beside a
    single file; a ModelLoadError naming that folder when its files are not there."""
    folder = path if path.is_dir() else sidecar(path, ".tokenizer")
    if not (folder / "tokenizer_config.json").is_file():
        raise ModelLoadError(f"no tokenizer for text encoder {path.name}: put its tokenizer "
                             f"files (tokenizer.json, tokenizer_config.json, …) in {folder}/")
    return folder


def load_transformers_encoder(cls: Any, path: Path, placement: Placement, what: str, *,
                              chat: bool = False) -> tuple[Any, Any]:
    """A transformers text encoder `cls` and its tokenizer (AutoTokenizer, local files only)
    from a folder, or from one file with `<stem>.config.json` and `<stem>.tokenizer/` beside
    it; checked complete, resting where the policy says. `chat`: the tokenizer must carry a
    chat template. Every tokenizer needs a pad token."""
    from transformers import AutoTokenizer

    tok_dir = tokenizer_folder(path)
    with load_errors(path, what, "text_encoders"):
        tokenizer = AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
        if path.is_dir():
            model = cls.from_pretrained(path, local_files_only=True, dtype=placement.torch_dtype)
        else:
            model = transformers_from_file(cls, path, placement)
        check_complete(model, path)
    if tokenizer.pad_token is None or (chat and not tokenizer.chat_template):
        needs = "a pad_token and a chat_template" if chat else "a pad_token"
        raise ModelLoadError(f"the tokenizer in {tok_dir} needs {needs}")
    return rest(model, placement), tokenizer


def transformers_from_file(cls: Any, path: Path, placement: Placement) -> Any:
    """A transformers model from one weight file and its sidecar config: both linked into a
    temporary folder laid out as from_pretrained reads one (its key conversions, ties, buffers
    and dtypes as for a folder)."""
    import tempfile

    config_path = sidecar(path, ".config.json")
    if not config_path.is_file():
        raise ModelLoadError(f"a single-file text encoder needs its transformers config: put "
                             f"it in {config_path} (or use the encoder's folder)")
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").symlink_to(config_path.resolve())
        (Path(folder) / "model.safetensors").symlink_to(path.resolve())
        return cls.from_pretrained(folder, local_files_only=True, dtype=placement.torch_dtype)


def cached_denoiser(models_dir: Path, name: str, policy: DevicePolicy, *, family: str,
                    key: str, load: Any, predict: Any) -> Any:
    """`diffusion_models/<name>` as the farm's DiffusionModel, loaded once per (content,
    placement, attention) by `load(path, placement)` (the family's transformer), cached."""
    path = resolve(models_dir, "diffusion_models", name)
    sha, placement = file_sha256(path), policy.placement("denoiser")
    refuse_int8(policy)

    def build() -> Any:
        return denoiser_model(name=name, sha=sha, transformer=load(path, placement),
                              predict=predict, placement=placement, policy=policy, family=family)

    return MODEL_CACHE.get_or_load((key, sha, placement, policy.attention), build)


def cached_vae(models_dir: Path, name: str, policy: DevicePolicy, *, family: str, key: str,
               load: Any, decode: Any, latent: Any) -> Any:
    """`vae/<name>` as the farm's Vae, loaded once per (content, placement, tiling, slicing)
    by `load(path, placement)` (the family's module, resting where it waits), cached."""
    path = resolve(models_dir, "vae", name)
    sha, placement = file_sha256(path), policy.placement("vae")

    def build() -> Any:
        return vae_model(name=name, sha=sha, module=load(path, placement), placement=placement,
                         policy=policy, decode=decode, latent=latent, family=family)

    cache_key = (key, sha, placement, policy.vae_tiling, policy.vae_slicing)
    return MODEL_CACHE.get_or_load(cache_key, build)


def cached_text_encoder(paths: Sequence[Path], policy: DevicePolicy, *, family: str, key: str,
                        load: Any, encode: Any, name: str = "") -> Any:
    """The text encoder(s) in `paths` (a family's one file, or FLUX.1's CLIP-L + T5) as the
    farm's TextEncoder `name` (default: their file names), loaded once per (contents, placement) by
    `load(placement)` → (model, tokenizer), cached."""
    refuse_int8(policy)
    sha = "".join(file_sha256(path) for path in paths)
    placement = policy.placement("text-encoder")

    def build() -> Any:
        model, tokenizer = load(placement)
        return text_encoder_model(name=name or " + ".join(p.name for p in paths), sha=sha, model=model,
                                  tokenizer=tokenizer, placement=placement, policy=policy,
                                  encode=encode, family=family)

    return MODEL_CACHE.get_or_load((key, sha, placement), build)
