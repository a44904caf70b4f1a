"""workers/memory.py: a run's peak memory is the largest the process held while it ran, even a
spike it freed before it ended; runs side by side each see the peak of their own span."""

from __future__ import annotations

import time

from workers.memory import SAMPLE_SECONDS, Meter


def _spike(megabytes: int) -> None:
    block = bytearray(megabytes << 20)  # zero-filled: every page touched, so resident
    time.sleep(SAMPLE_SECONDS * 20)
    del block


def test_a_spike_freed_before_the_run_ends_is_its_peak():
    meter = Meter("cpu")
    meter.start("a")
    before = meter.now()
    _spike(256)
    peak = meter.stop("a")
    assert peak is not None
    assert peak - before >= 200 << 20
    assert meter.now() - before < 64 << 20  # freed: what it holds now is not the peak


def test_each_run_has_the_peak_of_its_own_span_and_a_stranger_has_none():
    meter = Meter("cpu")
    meter.start("early")
    _spike(256)
    meter.start("late")  # starts after the spike
    time.sleep(SAMPLE_SECONDS * 5)
    late, early = meter.stop("late"), meter.stop("early")
    assert early is not None and late is not None
    assert early - late >= 200 << 20
    assert meter.stop("never-started") is None
    report = meter.report()
    assert report["kind"] == "rss" and report["bytes"] > 0 and report["baselineBytes"] > 0
