"""`text/generate` (ComfyUI's TextGenerate, the templates' LLM prompt enhancer) on the tiny
Krea 2 and Qwen-Image 2.1 stacks: its tokens are transformers' own `generate` on the same
Qwen3-VL checkpoint (loaded whole, with its head) with the same settings and seed, greedy and
sampled; an untied model reads its head from the file, and one without it is an error naming
the file; a cancel stops it between chunks of tokens, and other runs' device work runs between
those chunks without changing a token. A system prompt is the template's system turn, the
presence penalty lowers the generated tokens' logits as a hand-written processor does, an image
goes in through the encoder's processor, and ComfyUI's LTX-2 turns generate on the tiny LTX-2
stack's Gemma 3, with a Gemma LoRA (ComfyUI's keys) as its merged weights would."""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from workers.models.values import TextEncoder
from workers.runners import RUNNERS, NodeFailed, RunCancelled
from workers.runners.textgen import chat_text, generate, language_model

PROMPT = "a red fox in the snow"
SAMPLED = {"sampling": "on", "temperature": 0.7, "top_k": 64, "top_p": 0.95, "min_p": 0.05,
           "repetition_penalty": 1.05}
GREEDY = {"sampling": "off", "temperature": 0.7, "top_k": 64, "top_p": 0.95, "min_p": 0.05,
          "repetition_penalty": 1.05}


SYSTEM = "You rewrite prompts for an image model."


def node_params(settings: dict[str, Any], seed: int = 11, **more: Any) -> dict[str, Any]:
    return {"prompt": PROMPT, "max_length": 24, "seed": seed, "thinking": False,
            "use_default_template": True, "presence_penalty": 0.0, "system": "",
            "template": "model", **settings, **more}


@pytest.fixture(scope="module", params=["krea2", "qwenimage21"])
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
          ) -> tuple[str, Path, str]:
    """(family, models dir, the Qwen3-VL's file name) of the family's tiny stack."""
    from workers.models.families import plugin

    models_dir = tmp_path_factory.mktemp(f"{request.param}-textgen")
    names = plugin(request.param).write_tiny_stack(models_dir)
    return request.param, models_dir, names["text_encoder"]


def load_encoder(make_ctx: Any, models_dir: Path, name: str) -> TextEncoder:
    ctx = make_ctx(models_dir=models_dir)
    return RUNNERS["load/text-encoder"](ctx, {"file": name}, {})["encoder"]


def whole_checkpoint(path: Path) -> Any:
    """The checkpoint as transformers loads a Qwen3-VL to chat with: the generation class,
    head and all, from the file and its sidecar config."""
    from transformers import Qwen3VLForConditionalGeneration

    stem = path.name.removesuffix(".safetensors")
    with tempfile.TemporaryDirectory() as folder:
        shutil.copy(path.with_name(f"{stem}.config.json"), Path(folder) / "config.json")
        (Path(folder) / "model.safetensors").symlink_to(path.resolve())
        model = Qwen3VLForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
    return model.eval()


def reference_ids(model: Any, tokenizer: Any, family: str, params: dict[str, Any],
                  processors: tuple[Any, ...] = ()) -> Any:
    """transformers' generate on the whole checkpoint: the prompt in the tokenizer's chat
    template, after the params' system turn (Krea 2's tiny tokenizer has none: Qwen's ChatML
    written out), same settings, `torch.manual_seed(seed)`, and `processors` added."""
    system = params["system"]
    if family == "qwenimage21":
        chat = [*([{"role": "system", "content": [{"type": "text", "text": system}]}]
                  if system else []),
                {"role": "user", "content": [{"type": "text", "text": PROMPT}]}]
        text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    else:
        turn = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
        text = f"{turn}<|im_start|>user\n{PROMPT}<|im_end|>\n<|im_start|>assistant\n"
    return generated(model, tokenizer([text], return_tensors="pt"), tokenizer, params, processors)


def generated(model: Any, batch: Any, tokenizer: Any, params: dict[str, Any],
              processors: tuple[Any, ...] = (), eos: list[int] | None = None) -> Any:
    """The new ids of `model.generate` on `batch` with the params' settings and seed, ending on
    `eos` (Qwen's <|im_end|>)."""
    from transformers import GenerationConfig, LogitsProcessorList

    sampled = params["sampling"] == "on"
    config = GenerationConfig(
        max_new_tokens=params["max_length"], do_sample=sampled,
        eos_token_id=eos or [tokenizer.convert_tokens_to_ids("<|im_end|>")],
        pad_token_id=tokenizer.pad_token_id,
        **({k: params[k] for k in ("temperature", "top_k", "top_p", "min_p",
                                   "repetition_penalty")} if sampled else
           {"temperature": None, "top_k": None, "top_p": None}))
    torch.manual_seed(params["seed"])
    with torch.no_grad():
        out = model.generate(**batch, generation_config=config,
                             logits_processor=LogitsProcessorList(processors))
    return out[0, batch["input_ids"].shape[1]:]


@pytest.mark.parametrize("settings", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_the_nodes_tokens_are_transformers_generate_on_the_whole_checkpoint(
    stack: tuple[str, Path, str], make_ctx: Any, settings: dict[str, Any]
) -> None:
    family, models_dir, name = stack
    encoder = load_encoder(make_ctx, models_dir, name)
    tokenizer = getattr(encoder.tokenizer, "text", encoder.tokenizer)
    params = node_params(settings)
    lm = language_model(models_dir, encoder)
    ids = generate(lm, encoder, PROMPT, None, params, lambda: None)
    expected = reference_ids(whole_checkpoint(models_dir / "text_encoders" / name), tokenizer,
                             family, params)
    assert ids.tolist() == expected.tolist()
    assert len(ids) > 0
    text = RUNNERS["text/generate"](make_ctx(models_dir=models_dir), params,
                                    {"encoder": encoder})["text"]
    assert text == tokenizer.decode(expected, skip_special_tokens=True).strip()


def test_a_seed_gives_the_same_text_and_another_seed_another(
    stack: tuple[str, Path, str], make_ctx: Any
) -> None:
    _, models_dir, name = stack
    encoder = load_encoder(make_ctx, models_dir, name)
    lm = language_model(models_dir, encoder)
    first, again, other = (generate(lm, encoder, PROMPT, None, node_params(SAMPLED, seed=s),
                                    lambda: None).tolist() for s in (5, 5, 6))
    assert first == again and first != other
    assert language_model(models_dir, encoder) is lm  # the head is built once per encoder


def test_a_cancel_stops_generation_between_chunks(
    stack: tuple[str, Path, str], make_ctx: Any
) -> None:
    _, models_dir, name = stack
    encoder = load_encoder(make_ctx, models_dir, name)
    checks = []

    def check() -> None:
        checks.append(1)
        if len(checks) == 3:
            raise RunCancelled("cancelled by the test")

    ctx = make_ctx(models_dir=models_dir)
    ctx.check_cancelled = check
    with pytest.raises(RunCancelled):
        RUNNERS["text/generate"](ctx, node_params(GREEDY, max_length=200), {"encoder": encoder})
    assert len(checks) == 3


def untied_copy(models_dir: Path, name: str, target: Path, *, with_head: bool) -> str:
    """The Krea 2 Qwen3-VL as a model whose head is its own (`tie_word_embeddings` false), with
    a random `lm_head.weight` in the file or without it (as ComfyUI's files may leave it)."""
    stem = name.removesuffix(".safetensors")
    folder = target / "text_encoders"
    folder.mkdir(parents=True, exist_ok=True)
    config = json.loads((models_dir / "text_encoders" / f"{stem}.config.json").read_text())
    config["tie_word_embeddings"] = False
    config["text_config"]["tie_word_embeddings"] = False
    new = f"untied-{'head' if with_head else 'headless'}"
    (folder / f"{new}.config.json").write_text(json.dumps(config))
    shutil.copytree(models_dir / "text_encoders" / f"{stem}.tokenizer", folder / f"{new}.tokenizer")
    state = {k: v for k, v in load_file(models_dir / "text_encoders" / name).items()
             if k != "lm_head.weight"}
    if with_head:
        embeddings = state["model.language_model.embed_tokens.weight"]
        generator = torch.Generator().manual_seed(1)
        state["lm_head.weight"] = torch.randn(embeddings.shape, generator=generator)
    save_file(state, folder / f"{new}.safetensors")
    return f"{new}.safetensors"


def test_an_untied_model_reads_its_head_from_the_file(
    make_ctx: Any, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from workers.models.krea2.plugin import write_tiny_stack

    source = tmp_path_factory.mktemp("krea2-untied")
    names = write_tiny_stack(source)
    name = untied_copy(source, names["text_encoder"], tmp_path, with_head=True)
    encoder = load_encoder(make_ctx, tmp_path, name)
    params = node_params(GREEDY)
    ids = generate(language_model(tmp_path, encoder), encoder, PROMPT, None, params,
                   lambda: None)
    whole = whole_checkpoint(tmp_path / "text_encoders" / name)
    assert not torch.equal(whole.lm_head.weight, whole.model.language_model.embed_tokens.weight)
    assert ids.tolist() == reference_ids(whole, encoder.tokenizer, "krea2", params).tolist()


def test_an_untied_model_without_its_head_is_an_error_naming_the_file(
    make_ctx: Any, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from workers.models.krea2.plugin import write_tiny_stack

    source = tmp_path_factory.mktemp("krea2-headless")
    names = write_tiny_stack(source)
    name = untied_copy(source, names["text_encoder"], tmp_path, with_head=False)
    encoder = load_encoder(make_ctx, tmp_path, name)
    with pytest.raises(NodeFailed, match=f"{name} has no lm_head.weight"):
        RUNNERS["text/generate"](make_ctx(models_dir=tmp_path), node_params(GREEDY),
                                 {"encoder": encoder})


def test_an_encoder_that_is_no_language_model_is_refused(make_ctx: Any, smoke_stack: Any,
                                                         tmp_path: Path) -> None:
    from workers.models.flux1.plugin import write_tiny_stack

    names = write_tiny_stack(tmp_path)
    ctx = make_ctx(models_dir=tmp_path)
    encoder = RUNNERS["load/text-encoder"](
        ctx, {"file": names["text_encoder"], "file_2": names["text_encoder_2"]}, {})["encoder"]
    with pytest.raises(NodeFailed, match="not a language model that generates text"):
        RUNNERS["text/generate"](ctx, node_params(GREEDY), {"encoder": encoder})


@pytest.fixture(scope="module")
def whole(stack: tuple[str, Path, str]) -> Any:
    """The stack's Qwen3-VL loaded whole (transformers' own generation class)."""
    _, models_dir, name = stack
    return whole_checkpoint(models_dir / "text_encoders" / name)


@pytest.mark.parametrize("settings", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_a_system_prompt_is_the_chat_templates_system_turn(
    stack: tuple[str, Path, str], whole: Any, make_ctx: Any, settings: dict[str, Any]
) -> None:
    family, models_dir, name = stack
    encoder = load_encoder(make_ctx, models_dir, name)
    tokenizer = getattr(encoder.tokenizer, "text", encoder.tokenizer)
    lm = language_model(models_dir, encoder)
    params = node_params(settings, system=SYSTEM)
    ids = generate(lm, encoder, PROMPT, None, params, lambda: None)
    assert ids.tolist() == reference_ids(whole, tokenizer, family, params).tolist()
    assert f"system\n{SYSTEM}<|im_end|>" in chat_text(lm.config, tokenizer, PROMPT, False, params)
    # with the template off the prompt goes in as it is, without the system turn (ComfyUI's)
    raw = [generate(lm, encoder, PROMPT, None, node_params(settings, system=system,
                                                           use_default_template=False),
                    lambda: None).tolist() for system in (SYSTEM, "")]
    assert raw[0] == raw[1]


class HandPresence:
    """The presence penalty written out: each distinct token after the prompt, in each row,
    has its logit lowered by `penalty` once."""

    def __init__(self, penalty: float, prompt_length: int) -> None:
        self.penalty, self.prompt_length = penalty, prompt_length

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        scores = scores.clone()
        for row in range(input_ids.shape[0]):
            for token in set(input_ids[row, self.prompt_length:].tolist()):
                scores[row, token] -= self.penalty
        return scores


def test_the_presence_penalty_lowers_each_generated_token_once() -> None:
    from workers.runners.textgen_penalty import PresencePenalty

    generator = torch.Generator().manual_seed(3)
    input_ids = torch.randint(0, 10, (2, 9), generator=generator)  # repeats within each row
    scores = torch.randn(2, 10, generator=generator)
    penalised = PresencePenalty(1.5, 4)(input_ids, scores)
    assert torch.equal(penalised, HandPresence(1.5, 4)(input_ids, scores))
    assert not torch.equal(penalised, scores)


def test_the_nodes_presence_penalty_is_the_hand_written_one_in_generate(
    stack: tuple[str, Path, str], whole: Any, make_ctx: Any
) -> None:
    family, models_dir, name = stack
    encoder = load_encoder(make_ctx, models_dir, name)
    tokenizer = getattr(encoder.tokenizer, "text", encoder.tokenizer)
    lm = language_model(models_dir, encoder)
    params = node_params(SAMPLED, presence_penalty=2.0)
    ids = generate(lm, encoder, PROMPT, None, params, lambda: None).tolist()
    prompt_length = len(tokenizer(f"<|im_start|>user\n{PROMPT}<|im_end|>\n<|im_start|>"
                                  "assistant\n")["input_ids"]) if family == "krea2" else None
    if prompt_length is None:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": [{"type": "text", "text": PROMPT}]}], tokenize=False,
            add_generation_prompt=True)
        prompt_length = len(tokenizer(text)["input_ids"])
    expected = reference_ids(whole, tokenizer, family, params,
                             (HandPresence(2.0, prompt_length),)).tolist()
    assert ids == expected
    assert ids != generate(lm, encoder, PROMPT, None, node_params(SAMPLED), lambda: None).tolist()
    # greedy takes the most likely token, unpenalised (ComfyUI penalises sampling only)
    greedy = [generate(lm, encoder, PROMPT, None, node_params(GREEDY, presence_penalty=p),
                       lambda: None).tolist() for p in (2.0, 0.0)]
    assert greedy[0] == greedy[1]


VL_TEMPLATE = (  # Qwen3-VL's chat template, cut to what the test's chat uses
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% else %}{{ c['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def qwen21(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """(models dir, Qwen3-VL file) of the tiny Qwen-Image 2.1 stack (its tokenizer folder
    holds the image processor)."""
    from workers.models.families import plugin

    models_dir = tmp_path_factory.mktemp("qwenimage21-textgen-image")
    return models_dir, plugin("qwenimage21").write_tiny_stack(models_dir)["text_encoder"]


def test_an_image_goes_in_through_the_encoders_processor(qwen21: tuple[Path, str],
                                                         make_ctx: Any) -> None:
    import numpy as np
    from PIL import Image

    models_dir, name = qwen21
    ctx = make_ctx(models_dir=models_dir)
    encoder = RUNNERS["load/text-encoder"](ctx, {"file": name, "family": "qwenimage21"},
                                           {})["encoder"]
    # the tiny tokenizer's template writes text parts only; Qwen3-VL's writes an image's slot
    # and the assistant's start too: this test's encoder reads with a template that does
    tokenizer = copy.deepcopy(encoder.tokenizer.text)
    tokenizer.chat_template = VL_TEMPLATE
    processor = copy.copy(encoder.tokenizer.processor)
    processor.tokenizer = tokenizer
    encoder = dataclasses.replace(encoder, tokenizer=encoder.tokenizer._replace(
        text=tokenizer, processor=processor))
    pixels = np.random.default_rng(4).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    image = Image.fromarray(pixels)
    params = node_params(GREEDY)
    lm = language_model(models_dir, encoder)
    ids = generate(lm, encoder, PROMPT, image, params, lambda: None).tolist()
    assert ids != generate(lm, encoder, PROMPT, None, params, lambda: None).tolist()
    chat = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT}]}]
    text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    batch = processor(text=[text], images=[image], return_tensors="pt")
    whole_model = whole_checkpoint(models_dir / "text_encoders" / name)
    assert ids == generated(whole_model, batch, tokenizer, params).tolist()


@pytest.fixture(scope="module")
def ltx2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """(models dir, checkpoint) of the tiny LTX-2 stack (an LTX2Pipeline folder)."""
    from workers.models.ltx2.plugin import write_tiny_stack

    models_dir = tmp_path_factory.mktemp("ltx2-textgen")
    return models_dir, write_tiny_stack(models_dir)["checkpoint"]


def test_comfyuis_ltx_2_turns_generate_on_the_tiny_ltx_2_gemma(ltx2: tuple[Path, str],
                                                               make_ctx: Any) -> None:
    from transformers import Gemma3ForConditionalGeneration

    models_dir, name = ltx2
    ctx = make_ctx(models_dir=models_dir)
    encoder = RUNNERS["load/checkpoint"](ctx, {"file": name}, {})["encoder"]
    params = node_params(SAMPLED, template="ltx2", system=f"  {SYSTEM}\n")
    text = RUNNERS["text/generate"](ctx, params, {"encoder": encoder})["text"]
    tokenizer = encoder.tokenizer
    turns = (f"<start_of_turn>system\n{SYSTEM}<end_of_turn>\n<start_of_turn>user\n\n"
             f"User Raw Input Prompt: {PROMPT}.<end_of_turn>\n<start_of_turn>model\n")
    gemma = Gemma3ForConditionalGeneration.from_pretrained(
        models_dir / "checkpoints" / name / "text_encoder", dtype=torch.float32).eval()
    expected = generated(gemma, tokenizer([turns], return_tensors="pt"), tokenizer, params,
                         eos=[tokenizer.eos_token_id])
    assert len(expected) > 0
    assert text == tokenizer.decode(expected, skip_special_tokens=True).strip()


def test_a_gemma_lora_on_the_ltx_2_encoder_generates_as_its_merged_weights(
    ltx2: tuple[Path, str], make_ctx: Any
) -> None:
    """TextGenerateLTX2Prompt's Gemma LoRA (ComfyUI's LoraLoader, strength_clip 0.8): the
    node's text is transformers' generate on the Gemma 3 with W + 0.8 · α/r · B·A merged, and
    not the text without it; a prompt encoded through that encoder is the merged Gemma's
    encode."""
    from transformers import Gemma3ForConditionalGeneration

    from workers.models.ltx2 import GEMMA_LORA_PREFIX
    from workers.models.ltx2.tiny import write_tiny_gemma_lora

    models_dir, name = ltx2
    lora = write_tiny_gemma_lora(models_dir)
    ctx = make_ctx(models_dir=models_dir)
    loaded = RUNNERS["load/checkpoint"](ctx, {"file": name}, {})
    adapted = RUNNERS["load/lora"](ctx, {"lora": lora, "strength": 1.0, "strength_clip": 0.8},
                                   {"model": loaded["model"], "encoder": loaded["encoder"]})
    assert adapted["model"].loras == ()  # a text-encoder half only
    params = node_params(SAMPLED, template="ltx2", max_length=16)
    text = RUNNERS["text/generate"](ctx, params, {"encoder": adapted["encoder"]})["text"]
    plain = RUNNERS["text/generate"](ctx, params, {"encoder": loaded["encoder"]})["text"]
    gemma = Gemma3ForConditionalGeneration.from_pretrained(
        models_dir / "checkpoints" / name / "text_encoder", dtype=torch.float32).eval()
    state = load_file(models_dir / "loras" / lora)
    modules = dict(gemma.named_modules())
    with torch.no_grad():
        for key in [k for k in state if k.endswith(".lora_A.weight")]:
            module = key.removeprefix(GEMMA_LORA_PREFIX).removesuffix(".lora_A.weight")
            a, b = state[key], state[key.replace(".lora_A.", ".lora_B.")]
            alpha = float(state[key.replace(".lora_A.weight", ".alpha")])
            modules[f"model.language_model.{module}"].weight += 0.8 * alpha / a.shape[0] * b @ a
    tokenizer = loaded["encoder"].tokenizer
    turns = ("<start_of_turn>system\n<end_of_turn>\n<start_of_turn>user\n\n"
             f"User Raw Input Prompt: {PROMPT}.<end_of_turn>\n<start_of_turn>model\n")
    expected = generated(gemma, tokenizer([turns], return_tensors="pt"), tokenizer, params,
                         eos=[tokenizer.eos_token_id])
    assert text == tokenizer.decode(expected, skip_special_tokens=True).strip()
    assert text != plain
    # the LoRA'd encoder's prompt encode (CLIPTextEncode of its CLIP) is the merged Gemma's too
    from workers.models.ltx2.engine import encode_prompts
    from workers.models.ltx2.plugin import sequence_length

    encoded = RUNNERS["encode/text"](ctx, {"text": PROMPT},
                                     {"encoder": adapted["encoder"]})["conditioning"].embeds
    components = {**loaded["encoder"].model, "text_encoder": gemma}
    video, audio, _ = encode_prompts(components, [PROMPT], sequence_length(components))
    torch.testing.assert_close(encoded.video, video, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(encoded.audio, audio, atol=1e-5, rtol=1e-5)
    plain_encoded = RUNNERS["encode/text"](ctx, {"text": PROMPT},
                                           {"encoder": loaded["encoder"]})["conditioning"].embeds
    assert not torch.allclose(plain_encoded.video, video, atol=1e-3)


def test_a_lora_with_other_text_encoder_keys_is_refused_on_the_ltx_2_encoder(
    ltx2: tuple[Path, str], make_ctx: Any
) -> None:
    models_dir, name = ltx2
    (models_dir / "loras").mkdir(exist_ok=True)
    save_file({"lora_te_text_model_encoder_layers_0_self_attn_q_proj.lora_down.weight":
               torch.zeros(4, 32),
               "lora_te_text_model_encoder_layers_0_self_attn_q_proj.lora_up.weight":
               torch.zeros(16, 4)}, models_dir / "loras" / "kohya-te.safetensors")
    ctx = make_ctx(models_dir=models_dir)
    loaded = RUNNERS["load/checkpoint"](ctx, {"file": name}, {})
    with pytest.raises(NodeFailed, match=r"kohya-te\.safetensors has text-encoder weights "
                                         r"this farm does not apply to LTX-2's Gemma 3"):
        RUNNERS["load/lora"](ctx, {"lora": "kohya-te.safetensors", "strength": 1.0,
                                   "strength_clip": 1.0},
                             {"model": loaded["model"], "encoder": loaded["encoder"]})


def test_an_image_into_an_encoder_without_an_image_processor_is_refused(
    ltx2: tuple[Path, str], make_ctx: Any
) -> None:
    from PIL import Image

    models_dir, name = ltx2
    ctx = make_ctx(models_dir=models_dir)
    encoder = RUNNERS["load/checkpoint"](ctx, {"file": name}, {})["encoder"]
    with pytest.raises(NodeFailed, match="reads no images: its tokenizer folder has no image "
                                         "processor"):
        RUNNERS["text/generate"](ctx, node_params(GREEDY, template="ltx2"),
                                 {"encoder": encoder, "image": Image.new("RGB", (16, 16))})


def test_other_runs_device_work_runs_between_chunks_and_changes_no_token(
    stack: tuple[str, Path, str], whole: Any, make_ctx: Any
) -> None:
    """Between the generation's chunks another run's work gets the device thread: a forward
    of the same encoder module (which resets Qwen-VL's position state) and draws from the
    global RNG, as a denoise step's noise would. The sampled tokens stay those of one
    transformers `generate` call."""
    from concurrent.futures import ThreadPoolExecutor

    from workers.device.thread import THREAD_PREFIX, on_device_thread
    from workers.runners.textgen import causal_module

    family, models_dir, name = stack
    encoder = load_encoder(make_ctx, models_dir, name)
    tokenizer = getattr(encoder.tokenizer, "text", encoder.tokenizer)
    lm = language_model(models_dir, encoder)
    ran: list[str] = []

    def other_run() -> None:
        ran.append(threading.current_thread().name)
        torch.rand(100)
        with torch.no_grad():
            causal_module(encoder)(**tokenizer(["another run's prompt"], return_tensors="pt"))

    checks: list[int] = []

    def between_chunks() -> None:
        checks.append(1)
        if len(checks) == 2:  # the first chunk done, the second not begun
            with ThreadPoolExecutor(1) as another_runs_thread:  # its job waits for the thread
                another_runs_thread.submit(on_device_thread, other_run).result(timeout=120)

    params = node_params(SAMPLED, max_length=40)
    ids = generate(lm, encoder, PROMPT, None, params, between_chunks).tolist()
    assert len(ran) == 1 and ran[0].startswith(THREAD_PREFIX)
    assert len(checks) == 3  # 40 tokens: chunks of 16, 16 and 8
    assert ids == reference_ids(whole, tokenizer, family, params).tolist()


@pytest.mark.parametrize(("generated", "prompt", "text", "thinking"), [
    ("<think>\nA fox, then.\n</think>\n\nA red fox. ", "a fox", "A red fox.", "A fox, then."),
    ("  A red fox.\n", "a fox", "A red fox.", ""),
    ("<think>cut short by max_length", "a fox", "", "cut short by max_length"),
    ("musing</think> A fox.", "a fox <think>", "A fox.", "musing"),  # thinking begun in the prompt
    ("no opening</think> A fox.", "a fox", "no opening</think> A fox.", ""),
])
def test_the_reasoning_is_split_off_as_comfyui_splits_it(generated, prompt, text, thinking):
    from workers.runners.textgen import node_outputs

    params = node_params(GREEDY)
    assert node_outputs(generated, prompt, params) == {"text": text, "thinking": thinking}


def test_ltx_2s_turns_answer_the_prompt_itself_when_nothing_is_left():
    from workers.runners.textgen import node_outputs

    params = node_params(GREEDY, template="ltx2")
    assert node_outputs("<think>only thoughts", "a fox", params)["text"] == "a fox"
    assert node_outputs("  ", "a fox", params)["text"] == "a fox"
    assert node_outputs("A red fox.", "a fox", params)["text"] == "A red fox."
    assert node_outputs("", "a fox", node_params(GREEDY))["text"] == ""
