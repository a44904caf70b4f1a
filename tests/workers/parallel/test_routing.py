"""Routing runs that ask for a split, or that only a group can hold (torch-free, no database)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from apps.fleet.routing import RunCannotFit, parallel_request, route

FILES = [{"folder": "diffusion_models", "name": "z.safetensors"}]


@dataclass
class Live:
    name: str
    queues: list[str]
    device: dict[str, Any] = field(default_factory=lambda: {"profile": "cpu"})
    model_files: list[dict[str, str]] = field(default_factory=lambda: list(FILES))
    state: str = "online"


def gpu(vram: float) -> dict[str, Any]:
    return {"profile": "gpu-max", "vram_gb": vram}


def requirement(parallel: str | None = None, weights: float = 20, activations: float = 30
                ) -> dict[str, Any]:
    need = {"weightsGb": weights, "largestGb": weights, "activationsGb": activations,
            "vramGb": weights + activations}
    out: dict[str, Any] = {"models": FILES, "need": need}
    if parallel is not None:
        out["parallel"] = parallel
    return out


def test_the_largest_split_asked_for_wins() -> None:
    assert parallel_request(["auto", "2", None, "4"]) == "4"
    assert parallel_request(["auto", "off"]) == "off"
    assert parallel_request([None, "auto"]) == "auto"
    assert parallel_request([]) == "auto"


def test_a_run_asking_for_two_goes_to_xfuser_2_even_before_a_group_joins() -> None:
    fleet = [Live("one", ["gpu.80g"], gpu(80))]
    assert route(requirement("2"), fleet) == "xfuser.2"
    assert route(requirement("2"), []) == "xfuser.2"  # waits: no live worker serves xfuser.2


def test_auto_splits_only_what_no_single_gpu_can_hold() -> None:
    fleet = [Live("one", ["gpu.48g"], gpu(48)), Live("pair", ["xfuser.2"], gpu(48))]
    assert route(requirement(weights=20, activations=20), fleet) == "gpu.48g"
    # 20 GB of weights + 40 GB of activations: no 48 GB card; two ranks hold 20 + 20 each.
    assert route(requirement(weights=20, activations=40), fleet) == "xfuser.2"
    with pytest.raises(RunCannotFit):
        route(requirement("off", weights=20, activations=40), fleet)
    with pytest.raises(RunCannotFit):  # every rank holds all the weights: a split cannot help
        route(requirement(weights=50, activations=2), fleet)


def test_a_family_that_cannot_split_never_goes_to_a_group() -> None:
    """SDXL (FamilyInfo.splits False): asking for a group is a refusal that says what to set;
    in auto mode a run no single GPU holds is refused, not sent to a group that would fail it."""
    fleet = [Live("one", ["gpu.48g"], gpu(48)), Live("pair", ["xfuser.2"], gpu(48))]
    with pytest.raises(RunCannotFit, match=r'its sdxl model cannot be split across GPUs: set '
                                           r'parallel "off"'):
        route({**requirement("2"), "families": ["sdxl"]}, fleet)
    with pytest.raises(RunCannotFit):
        route({**requirement(weights=20, activations=40), "families": ["sdxl"]}, fleet)
    # FLUX.2 splits: the same run goes to the pair
    assert route({**requirement(weights=20, activations=40), "families": ["flux2"]},
                 fleet) == "xfuser.2"
