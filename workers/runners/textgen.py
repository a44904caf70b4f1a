"""`text/generate`: text from a loaded text encoder's own language model (ComfyUI's
TextGenerate, the LLM prompt enhancer of Krea 2's and Qwen-Image 2.1's templates).

The families load their encoders as transformers base models (`Qwen3VLModel`, `Qwen3Model`,
`Qwen2_5_VLModel`, …: hidden states, no output head). Generation wraps that same module, its
weights shared, in its model type's generation class (`Qwen3VLForConditionalGeneration`,
`Qwen3ForCausalLM`, …) with the output head: tied to the input embeddings where the config ties
them, else `lm_head.weight` read from the encoder's file (an error naming the file when it has
none). transformers' own `generate` then runs on it: greedy with sampling off, else its
sampling seeded by `torch.manual_seed(seed)` inside a forked RNG state, so a seed gives the same
text. It runs on the worker's device thread a chunk of tokens at a time, giving the thread back
(and checking for a cancel) between chunks (textgen_chunks.py). A family whose text encoder is a pipeline's
components (LTX-2's Gemma 3) generates with its `text_encoder`, a generation class already.

The prompt goes in as ComfyUI's TextGenerate puts it: a user turn of the model's chat template
(after a system turn when `system` is set), or as it is; `template: ltx2` writes ComfyUI's
TextGenerateLTX2Prompt turns instead (Gemma's, with a system turn). `presence_penalty` lowers
the logits of the tokens generated so far, as ComfyUI's sampler does (textgen_penalty.py).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from workers.device.thread import on_device_thread
from workers.models.catalog import ModelFileMissing, resolve
from workers.models.values import TextEncoder
from workers.runners.base import NodeContext, NodeFailed, runner
from workers.runners.textgen_chunks import Generation, generate_in_chunks, seeded_rng
from workers.runners.textgen_penalty import presence_processors

# base model module → its generation wrapper (the head built once per loaded encoder)
_LANGUAGE_MODELS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
ENCODER_FOLDERS = ("text_encoders", "checkpoints")  # where a text encoder's file may sit
NO_THINKING = "<think>\n\n</think>\n\n"  # Qwen3's template without thinking: an empty thought
END_OF_TURN = ("<|im_end|>", "<end_of_turn>")  # Qwen's and Gemma's: ComfyUI stops on them
QWEN_VISION = "<|vision_start|><|image_pad|><|vision_end|>"  # where Qwen-VL reads an image
# ComfyUI's TextGenerateLTX2Prompt (comfy_extras/nodes_textgen.py, its Gemma 3 path): Gemma's
# turns with a system turn, the image's soft token before the user's words
LTX2_TURNS = ("<start_of_turn>system\n{system}<end_of_turn>\n"
              "<start_of_turn>user\n{media}\nUser Raw Input Prompt: {prompt}.<end_of_turn>\n"
              "<start_of_turn>model\n")
LTX2_IMAGE = "\n<image_soft_token>\n"


@runner("text/generate")
def text_generate(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    encoder = inputs.get("encoder")
    if not isinstance(encoder, TextEncoder):
        raise NodeFailed("input 'encoder' is not a text encoder")
    prompt = str(inputs.get("prompt", params.get("prompt", "")))
    lm = language_model(ctx.models_dir, encoder)
    ids = generate(lm, encoder, prompt, inputs.get("image"), params, ctx.check_cancelled)
    tokenizer, _ = _tokenizers(encoder)
    return node_outputs(str(tokenizer.decode(ids, skip_special_tokens=True)), prompt, params)


def node_outputs(generated: str, prompt: str, params: dict[str, Any]) -> dict[str, str]:
    """`text` and `thinking` of the generated text, as ComfyUI's TextGenerate splits them: the
    reasoning is what comes before `</think>` where the text opens with `<think>` (or the raw
    prompt ends with it); cut short by max_length it has no close, and all is reasoning. The
    LTX-2 turns answer the prompt itself when nothing is left (ComfyUI's
    TextGenerateLTX2Prompt: an empty prompt conditions on nothing)."""
    reasoning, _, text = generated.partition("</think>")
    if not reasoning.lstrip().startswith("<think>") and not prompt.rstrip().endswith("<think>"):
        reasoning, text = "", generated
    answer = text.strip()
    if params.get("template") == "ltx2":
        answer = answer or prompt
    return {"text": answer, "thinking": reasoning.replace("<think>", "", 1).strip()}


def language_model(models_dir: Path, encoder: TextEncoder) -> Any:
    """The encoder's base model inside its generation class, with its output head (cached per
    loaded encoder)."""
    base = causal_module(encoder)
    found = _LANGUAGE_MODELS.get(base) if _is_module(base) else None
    if found is None:
        found = on_device_thread(lambda: _wrapped(models_dir, encoder))
        _LANGUAGE_MODELS[base] = found
    return found


def _is_module(model: Any) -> bool:
    import torch

    return isinstance(model, torch.nn.Module)


def causal_module(encoder: TextEncoder) -> Any:
    """The module that holds the encoder's language model: the encoder's model, or the
    `text_encoder` of a family that keeps its pipeline's components (LTX-2's Gemma 3)."""
    model = encoder.model
    return model.get("text_encoder", model) if isinstance(model, dict) else model


def generation_class(encoder: TextEncoder) -> Any:
    """The transformers class that generates with the encoder's model type; NodeFailed when
    the encoder is no causal language model (CLIP, T5, a family's pair of encoders)."""
    import transformers
    from transformers.models.auto import modeling_auto

    module = causal_module(encoder)
    config = getattr(module, "config", None)
    model_type = str(getattr(config, "model_type", ""))
    name = (modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES.get(model_type)
            or modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type))
    if not _is_module(module) or name is None or not hasattr(transformers, name):
        kind = model_type or type(module).__name__
        raise NodeFailed(f"text encoder {encoder.name} ({encoder.family}: {kind}) is not a "
                         "language model that generates text: text/generate needs a causal LM "
                         "encoder (a Qwen3-VL, Qwen2.5-VL or Qwen3)")
    return getattr(transformers, name)


def _wrapped(models_dir: Path, encoder: TextEncoder) -> Any:
    import torch
    from accelerate import init_empty_weights

    cls, base = generation_class(encoder), causal_module(encoder)
    if isinstance(base, cls):  # loaded whole, head and all (LTX-2's Gemma 3)
        return base.eval()
    with init_empty_weights():
        lm = cls(base.config)
    if not isinstance(base, type(lm.model)):
        raise NodeFailed(f"text encoder {encoder.name} is a {type(base).__name__}, not the "
                         f"{type(lm.model).__name__} {cls.__name__} generates with")
    lm.model = base
    embeddings = base.get_input_embeddings().weight  # [vocab, hidden]
    head = torch.nn.Linear(embeddings.shape[1], embeddings.shape[0], bias=False,
                           device=embeddings.device, dtype=embeddings.dtype)
    if _tied(base.config):
        head.weight = embeddings
    else:
        head.weight = torch.nn.Parameter(
            lm_head_weight(models_dir, encoder).to(embeddings.device, embeddings.dtype),
            requires_grad=False)
    lm.lm_head = head
    return lm.eval()


def _tied(config: Any) -> bool:
    """Whether the output head is the input embeddings (the config's or its text config's
    `tie_word_embeddings`, as transformers ties them)."""
    tied = getattr(config, "tie_word_embeddings", None)
    if tied is None:
        tied = getattr(config.get_text_config(), "tie_word_embeddings", False)
    return bool(tied)


def lm_head_weight(models_dir: Path, encoder: TextEncoder) -> Any:
    """`lm_head.weight` [vocab, hidden] from the encoder's file (or folder); NodeFailed naming
    the file when it has none (ComfyUI's text-encoder files may leave the head out)."""
    from safetensors import safe_open

    path = _encoder_path(models_dir, encoder.name)
    for file in _weight_files(path):
        with safe_open(str(file), framework="pt") as f:
            key = next((k for k in f.keys() if k.endswith("lm_head.weight")), None)  # noqa: SIM118 (safe_open is no dict)
            if key is not None:
                return f.get_tensor(key)
    raise NodeFailed(
        f"{path.name} has no lm_head.weight: this {causal_module(encoder).config.model_type} does not "
        "tie its output head to its embeddings, and text/generate needs the head (use the "
        "model's full checkpoint, which keeps it)")


def _encoder_path(models_dir: Path, name: str) -> Path:
    for folder in ENCODER_FOLDERS:
        try:
            return resolve(models_dir, folder, name)
        except ModelFileMissing:
            continue
    raise NodeFailed(f"cannot find the text encoder's file {name} in "
                     f"{' or '.join(ENCODER_FOLDERS)}/ to read its lm_head.weight")


def _weight_files(path: Path) -> Iterator[Path]:
    if path.is_dir():
        yield from sorted(path.glob("*.safetensors"))
    else:
        yield path


def generate(lm: Any, encoder: TextEncoder, prompt: str, image: Any, params: dict[str, Any],
             check_cancelled: Callable[[], None]) -> Any:
    """The ids [n] of the tokens `lm` generates after the prompt, as the node's params say, a
    chunk at a time on the device thread; `check_cancelled()` between chunks (on this thread)."""
    import torch
    from transformers import GenerationConfig

    tokenizer, processor = _tokenizers(encoder)
    text = chat_text(lm.config, tokenizer, prompt, image is not None, params)
    batch = model_inputs(lm.config, tokenizer, processor, text, image).to(lm.device)
    generation = Generation(
        inputs=dict(batch), config=GenerationConfig(**generation_settings(params, tokenizer)),
        processors=presence_processors(params, batch["input_ids"]),
        rng=seeded_rng(int(params["seed"]), lm.device), loras=encoder.loras)
    return torch.tensor(generate_in_chunks(lm, generation, check_cancelled), dtype=torch.long)


def generation_settings(params: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
    """GenerationConfig's arguments for the node's params (sampling off: greedy)."""
    ends = (tokenizer.eos_token_id, *(tokenizer.convert_tokens_to_ids(t) for t in END_OF_TURN))
    eos = [t for t in ends if isinstance(t, int) and t != tokenizer.unk_token_id]
    settings: dict[str, Any] = {
        "max_new_tokens": int(params["max_length"]), "eos_token_id": sorted(set(eos)) or None,
        "pad_token_id": tokenizer.pad_token_id, "do_sample": params["sampling"] == "on",
    }
    if settings["do_sample"]:
        settings.update(
            temperature=float(params["temperature"]), top_k=int(params["top_k"]) or None,
            top_p=float(params["top_p"]), min_p=float(params["min_p"]) or None,
            repetition_penalty=float(params["repetition_penalty"]) or None)
    else:  # greedy: no sampler's cut applies (transformers warns on any set)
        settings.update(temperature=None, top_k=None, top_p=None)
    return settings


def chat_text(config: Any, tokenizer: Any, prompt: str, has_image: bool,
              params: dict[str, Any]) -> str:
    """The text the model reads, as the node's params say: ComfyUI's LTX-2 turns (`template:
    ltx2`); the prompt as it is (`use_default_template` off: no system turn either, as
    ComfyUI); else the tokenizer's chat template, a system turn when `system` is set, the user
    turn and the assistant's start (Qwen's ChatML written out where the tokenizer has none)."""
    system, thinking = str(params.get("system", "")), bool(params["thinking"])
    if params.get("template") == "ltx2":
        return LTX2_TURNS.format(system=system.strip(), prompt=prompt,
                                 media=LTX2_IMAGE if has_image else "")
    slot = QWEN_VISION if has_image else ""
    if not params["use_default_template"]:
        return slot + prompt
    if not tokenizer.chat_template:
        turns = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
        text = f"{turns}<|im_start|>user\n{slot}{prompt}<|im_end|>\n<|im_start|>assistant\n"
        if not thinking and "<think>" in tokenizer.get_vocab():
            text += NO_THINKING
        return text
    content: Any = prompt
    if hasattr(config, "vision_config"):  # a VL template reads lists of parts
        content = [*([{"type": "image"}] if has_image else []), {"type": "text", "text": prompt}]
        system_content: Any = [{"type": "text", "text": system}]
    else:
        system_content = system
    chat = [*([{"role": "system", "content": system_content}] if system else []),
            {"role": "user", "content": content}]
    return str(tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True,
                                             enable_thinking=thinking))


def model_inputs(config: Any, tokenizer: Any, processor: Any, text: str, image: Any) -> Any:
    """The model's inputs for `text` (+ `image`, through the encoder's image processor)."""
    vision = hasattr(config, "vision_config")
    if image is None:
        return tokenizer([text], return_tensors="pt")
    if processor is None or not vision:
        raise NodeFailed("this text encoder reads no images: its tokenizer folder has no image "
                         "processor (preprocessor_config.json)" if vision else
                         "this text encoder reads no images (a text-only model)")
    return processor(text=[text], images=[image.convert("RGB")], return_tensors="pt")


def _tokenizers(encoder: TextEncoder) -> tuple[Any, Any]:
    """(the text tokenizer, the image processor or None): a family may keep both together
    (Qwen-Image 2.1's `Tokenizers`)."""
    held = encoder.tokenizer
    return getattr(held, "text", held), getattr(held, "processor", None)
