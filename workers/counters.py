"""What this worker process's batchers have done, counted for its heartbeat (`Worker.stats`).

A leaf module: the model code counts here and the heartbeat reads here, so neither imports the
other.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

_lock = threading.Lock()
_calls: Counter[str] = Counter()
_batch_sizes: Counter[int] = Counter()


def batcher_observer(name: str, *, batch_sizes: bool = False) -> Callable[[int], None]:
    """A batcher's `observe(jobs)`: counts its calls under `name`, those of more than one job
    under `<name>_batched`, and (for the denoiser) how many calls had each batch size."""

    def observe(jobs: int) -> None:
        with _lock:  # several models' batchers may count at once
            _calls[name] += 1
            if jobs > 1:
                _calls[f"{name}_batched"] += 1
            if batch_sizes:
                _batch_sizes[jobs] += 1

    return observe


def forwards_observer() -> Callable[[int], None]:
    """The denoiser's `observe`: forwards and their batch sizes (a model's step batcher, and a
    worker group's, workers/parallel/worker.py)."""
    return batcher_observer("forwards", batch_sizes=True)


def count(name: str) -> None:
    """One more `name` (e.g. `denoiser_loads`: base weights read from disk, whatever LoRAs the
    runs use; `lora_loads`: LoRA files read)."""
    with _lock:
        _calls[name] += 1


def counters_report() -> dict[str, Any]:
    """The counts so far, as the heartbeat reports them."""
    with _lock:
        return {**_calls, "batchSizes": {str(k): v for k, v in sorted(_batch_sizes.items())}}
