"""INLINE_PARALLEL, the degrees and the method from the hardware (no torch, no processes)."""

from __future__ import annotations

import pytest

from workers.parallel.config import (
    Degrees,
    GroupSetup,
    ParallelConfigError,
    auto_degrees,
    group_setup,
    parse_parallel,
)
from workers.parallel.worker import setup_from_env


def test_degrees_multiply_to_the_world() -> None:
    assert parse_parallel("ulysses=2,ring=2") == Degrees(ulysses=2, ring=2)
    assert parse_parallel("cfg=2, ulysses=2") == Degrees(cfg=2, ulysses=2)
    assert Degrees(cfg=2, ulysses=2, ring=2).world == 8
    assert parse_parallel("") is None and parse_parallel("off") is None
    assert parse_parallel("auto") == "auto"


@pytest.mark.parametrize("value, words", [
    ("pipefusion=2", "PipeFusion does not exist for Z-Image"),
    ("tp=2", "no tensor parallelism"),
    ("ulysses", "expected `auto`, `off` or degrees"),
    ("ulysses=two", "expected `auto`"),
    ("ulysses=2,ulysses=2", "ulysses is given twice"),
    ("cfg=4", "cfg is 1 or 2"),
    ("ring=0", "ring must be >= 1"),
])
def test_a_bad_setting_names_what_is_wrong(value: str, words: str) -> None:
    with pytest.raises(ParallelConfigError, match=words):
        parse_parallel(value)


def test_cfg_parallel_only_when_guided_and_the_links_pick_ulysses_or_ring() -> None:
    assert auto_degrees(2, nvlink=True, guidance=0.0) == Degrees(ulysses=2)
    assert auto_degrees(2, nvlink=False, guidance=0.0) == Degrees(ring=2)
    assert auto_degrees(4, nvlink=True, guidance=3.5) == Degrees(cfg=2, ulysses=2)
    assert auto_degrees(4, nvlink=False, guidance=3.5) == Degrees(cfg=2, ring=2)
    assert auto_degrees(3, nvlink=True, guidance=3.5) == Degrees(ulysses=3)  # odd: no cfg half
    assert GroupSetup(2, None, nvlink=True).degrees_for(1.0) == Degrees(cfg=2)
    assert GroupSetup(2, Degrees(ring=2)).degrees_for(1.0) == Degrees(ring=2)  # fixed wins


def test_a_group_worker_must_serve_its_own_size() -> None:
    assert group_setup("ulysses=2", ["xfuser.2"], gpus=0) == GroupSetup(2, Degrees(ulysses=2))
    assert group_setup(None, ["xfuser.4", "cpu"], gpus=0) == GroupSetup(4, None)  # auto
    assert group_setup(None, ["cpu", "gpu.24g"], gpus=1) is None
    with pytest.raises(ParallelConfigError, match=r"serves xfuser\.2; they must be equal"):
        group_setup("ulysses=2,ring=2", ["xfuser.2"], gpus=0)
    with pytest.raises(ParallelConfigError, match=r"serve xfuser.2 \(-Q"):
        group_setup("cfg=2", ["cpu"], gpus=0)
    with pytest.raises(ParallelConfigError, match="has 4 GPUs; they must be equal"):
        group_setup("ulysses=2", ["xfuser.2"], gpus=4)
    with pytest.raises(ParallelConfigError, match="at least 2 ranks"):
        group_setup("ulysses=1", ["xfuser.1"], gpus=0)
    with pytest.raises(ParallelConfigError, match="one size"):
        group_setup(None, ["xfuser.2", "xfuser.4"], gpus=0)


def test_a_cpu_worker_runs_its_group_on_gloo() -> None:
    env = {"INLINE_PROFILE": "cpu", "INLINE_PARALLEL": "cfg=2"}
    assert setup_from_env(["xfuser.2"], env) == (GroupSetup(2, Degrees(cfg=2)), "gloo")
    assert setup_from_env(["cpu"], {"INLINE_PROFILE": "cpu"}) == (None, "gloo")
