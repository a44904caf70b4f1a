"""Loading LTX-2 locally (`local_files_only`, nothing downloads): a diffusers LTX2Pipeline
folder (`model_index.json` + transformer / connectors / vae / audio_vae / vocoder / text_encoder /
tokenizer / scheduler, as Lightricks publishes LTX-2 for diffusers) into the components dict the
engine reads. Cached per process by the folder's path and its model_index.json's mtime.

Or ComfyUI's all-in-one single file (`ltx-2-19b-dev.safetensors`: the transformer and the text
connectors under `model.diffusion_model.`, `text_embedding_projection.`, `vae.`, `audio_vae.`,
`vocoder.`; workers/models/ltx2/keys.py reads its original keys) with its configs beside it:
`<stem>.diffusers/`, an LTX2Pipeline folder without those five components' weights
(model_index.json optional; transformer/, connectors/, vae/, audio_vae/, vocoder/ with their
config.json; scheduler/; tokenizer/; text_encoder/: the Gemma 3's config.json and weights,
diffusers' or ComfyUI's text-only gemma_3_12B_it file linked in as model.safetensors). Nothing
downloads: a missing config, tokenizer or weight is an error naming that folder. Cached by the
file's path and mtime.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from workers.models.family import ModelLoadError

COMPONENTS = (
    "transformer",
    "connectors",
    "vae",
    "audio_vae",
    "vocoder",
    "text_encoder",
    "tokenizer",
    "scheduler",
)
COMFY_GEMMA = "model.layers."  # ComfyUI's text-only Gemma 3 file (diffusers': language_model.)
FROM_FILE = ("transformer", "connectors", "vae", "audio_vae", "vocoder")  # the single file's
_cache: dict[tuple[str, int], dict[str, Any]] = {}
_lock = threading.Lock()


def load_folder(path: Path) -> dict[str, Any]:
    """The components (float32, eval) of the LTX2Pipeline folder at `path`. Raises ModelLoadError
    naming the folder and what is missing or broken."""
    index = path / "model_index.json"
    if not index.is_file():
        raise ModelLoadError(f"{path.name}: not an LTX-2 diffusers folder (no model_index.json)")
    missing = [c for c in COMPONENTS if not (path / c).is_dir()]
    if missing:
        raise ModelLoadError(f"{path.name}: the LTX-2 folder lacks {', '.join(missing)}")
    key = (str(path.resolve()), index.stat().st_mtime_ns)
    with _lock:
        if key in _cache:
            return _cache[key]
    from diffusers import LTX2Pipeline

    try:
        pipe: Any = LTX2Pipeline.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ModelLoadError(f"cannot load the LTX-2 folder {path.name}: {exc}") from None
    components = {name: getattr(pipe, name) for name in COMPONENTS}
    _settle(components)
    with _lock:
        _cache[key] = components
    return components


def _settle(components: dict[str, Any]) -> None:
    """Every module in eval mode, its weights in fresh memory: loaded weights are views into a
    file's buffer at offsets that differ between a folder and a single file, and CPU kernels
    round differently on them (weights.own_storage); copied, the same weights give the same
    clip from either."""
    from workers.models.weights import own_storage

    for module in components.values():
        if hasattr(module, "eval"):
            own_storage(module)
            module.eval()


def load_single_file(path: Path) -> dict[str, Any]:
    """The components (float32, eval) of the all-in-one file at `path` with its configs in
    `<stem>.diffusers/`. Raises ModelLoadError naming the file or the folder and what is
    missing or does not match."""
    from workers.models.weights import sidecar

    configs = sidecar(path, ".diffusers")
    missing = [c for c in (*FROM_FILE, "scheduler", "tokenizer", "text_encoder")
               if not (configs / c).is_dir()]
    if missing:
        raise ModelLoadError(
            f"{path.name}: an LTX-2 single file needs its configs, tokenizer and Gemma 3 text "
            f"encoder beside it in {configs}/ (an LTX2Pipeline folder's {', '.join(missing)}; "
            f"{', '.join(FROM_FILE)} need only their config.json)")
    key = (str(path.resolve()), path.stat().st_mtime_ns)
    with _lock:
        if key in _cache:
            return _cache[key]
    components = {**_from_file(path, configs), **_beside(path, configs)}
    _settle(components)
    with _lock:
        _cache[key] = components
    return components


def _from_file(path: Path, configs: Path) -> dict[str, Any]:
    """The five components the file holds, each built from its config with its weights."""
    from safetensors.torch import load_file

    from workers.models.ltx2 import keys
    from workers.models.weights import load_errors

    with load_errors(path, "an LTX-2 checkpoint", "checkpoints"):
        state = load_file(str(path))
        if not keys.is_single_file(state):
            raise ModelLoadError(f"{path.name} is not LTX-2's all-in-one file (it lacks "
                                 "model.diffusion_model. / vae. / audio_vae. weights)")
        layout = "LTX-2.3" if keys.is_ltx23(state) else "LTX-2.0"
        return build_parts(keys.from_original(state), dict.fromkeys(FROM_FILE, configs),
                           f"{path.name} (an {layout} file)", path)


def build_parts(parts: dict[str, dict[str, Any]], configs: dict[str, Path], what: str,
                path: Path) -> dict[str, Any]:
    """FROM_FILE's components from keys.from_original's `parts`, each built from the
    config.json in `configs[name]/<name>/`; a mismatch says "`what`: its <name> does not match
    …"."""
    from diffusers import AutoencoderKLLTX2Audio, AutoencoderKLLTX2Video, LTX2VideoTransformer3DModel
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    from workers.models.weights import check_complete

    classes = {"transformer": LTX2VideoTransformer3DModel, "connectors": LTX2TextConnectors,
               "vae": AutoencoderKLLTX2Video, "audio_vae": AutoencoderKLLTX2Audio,
               "vocoder": LTX2Vocoder}
    out = {}
    for name, cls in classes.items():
        folder = configs[name]
        config = cls.load_config(str(folder / name), local_files_only=True)
        mismatch = (f"{what}: its {name} does not match {folder.name}/{name}/config.json "
                    "(put that version's diffusers configs there)")
        out[name] = _assign(cls, config, parts[name], mismatch)
        check_complete(out[name], path)
    return out


def _assign(cls: Any, config: Any, state: dict[str, Any], mismatch: str) -> Any:
    """`cls` from `config` on the meta device with its weights assigned from `state`; every key
    must match (computed buffers such as rotary tables stay real), else an error that starts
    with `mismatch`."""
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):
        model = cls.from_config(config) if hasattr(cls, "from_config") else cls._from_config(config)
    try:
        result = model.load_state_dict(state, strict=False, assign=True)
    except RuntimeError as exc:  # shapes that differ from the config's
        raise ModelLoadError(f"{mismatch}: {str(exc).splitlines()[-1].strip()}") from None
    if result.missing_keys or result.unexpected_keys:
        raise ModelLoadError(f"{mismatch}: missing {result.missing_keys[:3]}, unexpected "
                             f"{result.unexpected_keys[:3]}")
    return model.float()


def _beside(path: Path, configs: Path) -> dict[str, Any]:
    """The scheduler, tokenizer and Gemma 3 text encoder from the configs folder."""
    from diffusers import FlowMatchEulerDiscreteScheduler
    from transformers import AutoTokenizer

    if not any((configs / "tokenizer").glob("tokenizer*")):
        raise ModelLoadError(f"{path.name}: no tokenizer files (tokenizer.json, "
                             f"tokenizer_config.json, …) in {configs / 'tokenizer'}/")
    try:
        return {
            "scheduler": FlowMatchEulerDiscreteScheduler.from_pretrained(
                configs / "scheduler", local_files_only=True),
            "tokenizer": AutoTokenizer.from_pretrained(configs / "tokenizer",
                                                       local_files_only=True),
            "text_encoder": _gemma(configs / "text_encoder"),
        }
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ModelLoadError(f"cannot load {path.name}'s scheduler, tokenizer or text encoder "
                             f"from {configs}/: {exc}") from None


def _gemma(folder: Path) -> Any:
    """The Gemma 3 in `folder` (config.json + weights): diffusers' LTX-2 text_encoder/ (a
    Gemma3ForConditionalGeneration), or ComfyUI's gemma_3_12B_it file linked in as its weights
    (the text model alone, `model.layers.*`, + its tokenizer as `spiece_model`): then
    `gemma_from_state`. A weight the file lacks is an error naming the folder (transformers
    would leave it random)."""
    from safetensors import safe_open
    from transformers import Gemma3ForConditionalGeneration

    files = sorted(folder.glob("*.safetensors"))
    keys: set[str] = set()
    for weights in files:
        with safe_open(str(weights), "pt") as f:
            keys.update(f.keys())
    if any(k.startswith(COMFY_GEMMA) for k in keys):
        from safetensors.torch import load_file

        state = {k: v for weights in files for k, v in load_file(str(weights)).items()}
        return gemma_from_state(folder, state)
    loaded: Any = Gemma3ForConditionalGeneration.from_pretrained(  # (model, loading info)
        folder, local_files_only=True, output_loading_info=True)
    model, info = loaded
    missing = info["missing_keys"]
    if missing:
        raise ModelLoadError(f"the Gemma 3 weights in {folder}/ do not match its config.json: "
                             f"missing {sorted(missing)[:3]}")
    return model


def gemma_from_state(folder: Path, state: dict[str, Any]) -> Any:
    """The text encoder that `folder`'s config.json describes, with `state`'s weights in
    ComfyUI's text-only keys (`model.layers.*`; other keys are ignored) or in transformers'
    (`model.language_model.*`). A Gemma 3 in ComfyUI's keys is its text model alone
    (Gemma3TextModel), all LTX-2 encodes with; LTX-2.5's Gemma 4 ("gemma4_unified") is
    Gemma4UnifiedForConditionalGeneration either way: its model type is how diffusers picks
    2.5's image CRF (18), and its tied output head shares the embedding."""
    from transformers import (
        AutoConfig,
        Gemma3ForConditionalGeneration,
        Gemma3TextModel,
        Gemma4UnifiedForConditionalGeneration,
    )

    config: Any = AutoConfig.from_pretrained(folder, local_files_only=True)
    mismatch = f"the text encoder's weights do not match {folder}/config.json"
    comfy = any(k.startswith(COMFY_GEMMA) for k in state)
    if config.model_type == "gemma3" and comfy:
        text = {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}
        return _assign(Gemma3TextModel, config.text_config, text, mismatch)
    classes = {"gemma3": Gemma3ForConditionalGeneration,
               "gemma4_unified": Gemma4UnifiedForConditionalGeneration}
    if config.model_type not in classes:
        raise ModelLoadError(f"{folder}/config.json describes a {config.model_type}, not LTX-2's "
                             "Gemma 3 or Gemma 4 text encoder")
    if comfy:
        state = {"model.language_model." + k.removeprefix("model."): v
                 for k, v in state.items() if k.startswith("model.")}
    embed = state.get("model.language_model.embed_tokens.weight")
    if getattr(config, "tie_word_embeddings", False) and embed is not None:
        state = {**state, "lm_head.weight": embed}
    return _assign(classes[config.model_type], config, state, mismatch)
