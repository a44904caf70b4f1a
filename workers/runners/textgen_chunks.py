"""`text/generate`'s generation in chunks of tokens, the device thread given back between them.

A long generation would hold the worker's one device thread for its whole length, and every
other run's denoise steps would wait for it. Instead the run's own thread asks for `CHUNK`
tokens at a time (`on_device_thread`), checks for a cancel between chunks (on its own thread,
as the step batcher's jobs do), and other runs' work runs in between. Each chunk continues
transformers' `generate` from the last: the ids so far, the key/value cache, the global RNG's
state (so a seed's draws are the same, whatever ran in between) and the model's own position
state (Qwen-VL's `rope_deltas`, which another forward of the same module may change) — the
tokens are those of one `generate` call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from workers.device.thread import on_device_thread

CHUNK = 16  # tokens per turn on the device thread


@dataclass
class Generation:
    """One generation between chunks. `inputs`: what the next chunk's `generate` reads (the
    prompt's inputs at first, then the ids so far [1, L]); `new`: the tokens so far."""

    inputs: dict[str, Any]
    config: Any  # transformers.GenerationConfig: the node's settings, max_new_tokens the total
    processors: list[Any]
    rng: dict[str, Any]  # the RNG states the next chunk resumes ("cpu", "cuda")
    cache: Any = None
    rope_deltas: Any = None
    loras: tuple[Any, ...] = ()  # the encoder's AppliedLoras (`load/lora`'s strength_clip half)
    new: list[int] = field(default_factory=list)
    done: bool = False


def generate_in_chunks(lm: Any, generation: Generation, check_cancelled: Callable[[], None]
                       ) -> list[int]:
    """The tokens `lm` generates, a chunk at a time on the device thread; `check_cancelled()`
    (on the caller's thread) before each chunk."""
    while not generation.done:
        check_cancelled()
        on_device_thread(_next_chunk, lm, generation)
    return generation.new


def seeded_rng(seed: int, device: Any) -> dict[str, Any]:
    """The RNG states `torch.manual_seed(seed)` sets (the CPU's and `device`'s CUDA's), taken
    without changing the process's."""
    import torch

    with torch.random.fork_rng(devices=_cuda_devices(device)):
        torch.manual_seed(seed)
        return _rng_state(device)


def _next_chunk(lm: Any, generation: Generation) -> None:
    """Up to CHUNK more tokens into `generation` (on the device thread)."""
    import torch
    from transformers import LogitsProcessorList

    from workers.models.lora import rows as lora_rows

    config = generation.config
    wanted = min(CHUNK, int(config.max_new_tokens) - len(generation.new))
    model: Any = getattr(lm, "model", None)
    with (torch.no_grad(), torch.random.fork_rng(devices=_cuda_devices(lm.device)),
          lora_rows([generation.loras])):
        _set_rng_state(generation.rng, lm.device)
        if generation.cache is not None and hasattr(model, "rope_deltas"):
            model.rope_deltas = generation.rope_deltas
        out = lm.generate(**generation.inputs, cache=generation.cache,
                          generation_config=config, max_new_tokens=wanted,
                          return_dict_in_generate=True,
                          logits_processor=LogitsProcessorList(generation.processors))
        generation.rng = _rng_state(lm.device)
    generation.rope_deltas = getattr(model, "rope_deltas", None)
    sequences = out.sequences  # [1, L + n]
    new = sequences[0, generation.inputs["input_ids"].shape[1]:].tolist()
    generation.new += new
    generation.cache = out.cache
    generation.inputs = {"input_ids": sequences, "attention_mask": torch.ones_like(sequences)}
    eos = config.eos_token_id
    ends = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    generation.done = (len(new) < wanted or (bool(new) and new[-1] in ends)
                       or len(generation.new) >= int(config.max_new_tokens))


def _rng_state(device: Any) -> dict[str, Any]:
    import torch

    state = {"cpu": torch.get_rng_state()}
    if _cuda_devices(device):
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict[str, Any], device: Any) -> None:
    import torch

    torch.set_rng_state(state["cpu"])
    if "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def _cuda_devices(device: Any) -> list[int]:
    return [device.index or 0] if getattr(device, "type", "") == "cuda" else []
