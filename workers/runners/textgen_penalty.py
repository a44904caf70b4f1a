"""`text/generate`'s presence penalty: ComfyUI's TextGenerate lowers the logits of the tokens it
has generated so far by `presence_penalty` (comfy/text_encoders/llama.py `apply_penalty`: after
the repetition penalty, before temperature and the top-k / top-p / min-p cuts; sampling only,
the prompt's tokens not counted). transformers has no such processor; this is one, and
`generate` runs custom processors exactly there (after its repetition penalty, before its
sampling warpers)."""

from __future__ import annotations

from typing import Any


def presence_processors(params: dict[str, Any], prompt_ids: Any) -> list[Any]:
    """The logits processors the node's presence penalty adds to `generate` (none when
    sampling is off or the penalty is 0, as ComfyUI)."""
    penalty = float(params.get("presence_penalty", 0.0))
    if params["sampling"] != "on" or penalty == 0.0:
        return []
    return [PresencePenalty(penalty, int(prompt_ids.shape[1]))]


class PresencePenalty:
    """Subtracts `penalty` once from the logit of every token generated after the first
    `prompt_length` ids, however often it occurred."""

    def __init__(self, penalty: float, prompt_length: int) -> None:
        self.penalty, self.prompt_length = penalty, prompt_length

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        """input_ids [B, prompt + generated]; scores [B, vocab] → scores, penalised."""
        import torch

        generated = input_ids[:, self.prompt_length:]  # [B, n]
        present = torch.zeros_like(scores, dtype=torch.bool)
        present.scatter_(1, generated, True)
        return torch.where(present, scores - self.penalty, scores)
