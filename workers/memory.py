"""How much memory this worker process uses, and the peak while each run ran.

A leaf module (the attempt measures, the heartbeat reports). What is measured depends on the
device the worker computes on:
- `cuda`: torch's allocated bytes on the worker's GPU (`torch.cuda.memory_allocated`); a run's
  peak is `max_memory_allocated` since the peak statistic was last reset, which happens when the
  worker goes from no run to one (so with runs side by side, each run's peak is the device's
  peak since the first of them started: the memory they needed together).
- `rss`: the process's resident memory (/proc/self/statm), sampled every SAMPLE_SECONDS by one
  thread while runs are held; a run's peak is the largest sample while it ran.
`baseline` is the process's memory when the worker started, before any model was loaded: what a
run's own figure is measured above on a CPU worker (weights loaded by a run stay resident).
"""

from __future__ import annotations

import os
import threading
from typing import Any

SAMPLE_SECONDS = 0.01


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):  # not Linux: the lifetime peak is what there is
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class Meter:
    """The memory of this process on `device` ("cuda…" or "cpu"), and per-run peaks."""

    def __init__(self, device: str = "cpu") -> None:
        self.kind = "cuda" if device.startswith("cuda") else "rss"
        self.device = device
        self._lock = threading.Lock()
        self._peaks: dict[str, int] = {}  # run id -> the peak while it ran (so far)
        self._wake = threading.Event()
        self._sampler: threading.Thread | None = None
        self.baseline = self.now()

    def now(self) -> int:
        if self.kind == "cuda":
            import torch

            return int(torch.cuda.memory_allocated(self.device))
        return _rss_bytes()

    def start(self, run_id: str) -> None:
        """Begin measuring `run_id`'s peak."""
        with self._lock:
            first = not self._peaks
            if first and self.kind == "cuda":
                import torch

                torch.cuda.reset_peak_memory_stats(self.device)
            self._peaks[run_id] = self.now()
            if self.kind == "rss" and (self._sampler is None or not self._sampler.is_alive()):
                self._sampler = threading.Thread(target=self._sample, name="memory", daemon=True)
                self._sampler.start()
            self._wake.set()

    def stop(self, run_id: str) -> int | None:
        """The peak bytes while `run_id` ran (None if it was not measured)."""
        with self._lock:
            if run_id not in self._peaks:
                return None
            self._note(self._current_peak())
            return self._peaks.pop(run_id)

    def report(self) -> dict[str, Any]:
        """For the heartbeat (`Worker.stats["memory"]`)."""
        return {"kind": self.kind, "bytes": self.now(), "baselineBytes": self.baseline}

    def _current_peak(self) -> int:
        if self.kind == "cuda":
            import torch

            return int(torch.cuda.max_memory_allocated(self.device))
        return _rss_bytes()

    def _note(self, value: int) -> None:
        """Raise every held run's peak to `value`. Call holding the lock."""
        for run_id, peak in self._peaks.items():
            if value > peak:
                self._peaks[run_id] = value

    def _sample(self) -> None:
        while True:
            self._wake.wait()
            with self._lock:
                if not self._peaks:
                    self._wake.clear()
                    continue
                self._note(_rss_bytes())
            threading.Event().wait(SAMPLE_SECONDS)


_meter: Meter | None = None
_meter_lock = threading.Lock()


def meter() -> Meter:
    """This process's meter, on the device of the worker's policy (workers/runtime.py)."""
    global _meter
    with _meter_lock:
        if _meter is None:
            from workers.runtime import policy

            _meter = Meter(policy().device)
        return _meter
