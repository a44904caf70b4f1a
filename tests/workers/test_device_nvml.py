"""GPU description: NVML is optional, INLINE_GPU_DESCRIPTION simulates a card, and the worker's
heartbeat description carries the card (name, memory) while a simulated one computes on CPU."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from apps.fleet.capability import gpu_queue_for_vram
from workers.device import nvml
from workers.device.detect import ReportingPolicy, policy_from_env
from workers.device.policy import Placement

L40S = json.dumps({"name": "L40S", "vram_gb": 48})


def test_without_a_simulation_the_host_lists_the_gpus_its_driver_reports():
    """NVML's view, checked against the driver's own tool: no GPU on a host without the driver
    or a card (every CPU host of CI), each card by index, name and memory on a CUDA host."""
    driver = driver_gpus()
    gpus = nvml.host_gpus({})
    assert [(g.index, g.name, g.simulated) for g in gpus] == [
        (index, name, False) for index, (name, _) in enumerate(driver)]
    for gpu, (_, mib) in zip(gpus, driver, strict=True):  # the tool rounds to whole MiB
        assert abs(gpu.total_gb * 1024 - mib) <= 1, (gpu, mib)


def driver_gpus() -> list[tuple[str, int]]:
    """(name, total MiB) of each GPU `nvidia-smi` lists, in its (NVML's) index order; none
    without the driver's tool, or when it finds no driver or card."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    listed = subprocess.run([smi, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                            capture_output=True, text=True, timeout=60, check=False)
    if listed.returncode != 0:  # the tool without a loaded driver or a card
        return []
    rows = [line.rsplit(",", 1) for line in listed.stdout.splitlines() if line.strip()]
    return [(name.strip(), int(mib)) for name, mib in rows]


def test_a_simulated_gpu_is_described_like_a_card_of_that_size():
    (gpu,) = nvml.host_gpus({"INLINE_GPU_DESCRIPTION": L40S})
    assert (gpu.index, gpu.name, gpu.total_gb, gpu.simulated) == (0, "L40S", 48.0, True)
    assert gpu.to_report() == {"index": 0, "name": "L40S", "totalGb": 48.0, "freeGb": 48.0,
                               "usedGb": 0.0, "nvlink": 0, "simulated": True}


def test_a_list_simulates_a_host_with_several_gpus():
    raw = json.dumps([{"name": "RTX 4090", "vram_gb": 24}, {"name": "H200", "vram_gb": 141,
                                                             "nvlink": 18}])
    gpus = nvml.host_gpus({"INLINE_GPU_DESCRIPTION": raw})
    assert [(g.index, g.name, g.nvlink) for g in gpus] == [(0, "RTX 4090", 0), (1, "H200", 18)]


@pytest.mark.parametrize("raw, message", [
    ("not json", "must be JSON"),
    ('{"name": "L40S"}', "name and vram_gb"),
    ('{"name": "L40S", "vram_gb": 0}', "vram_gb must be a number > 0"),
    ('{"name": "L40S", "vram_gb": 48, "vram": 1}', "unknown keys"),
])
def test_a_bad_simulated_description_is_a_clear_error(raw, message):
    with pytest.raises(ValueError, match=message):
        nvml.host_gpus({"INLINE_GPU_DESCRIPTION": raw})


def test_a_simulated_card_reports_the_policy_it_would_get_and_computes_on_cpu():
    policy = policy_from_env({"INLINE_GPU_DESCRIPTION": L40S})
    assert isinstance(policy, ReportingPolicy)
    assert policy.placement("denoiser") == Placement("cpu", "float32", offload=False)
    described = policy.describe()
    assert (described["profile"], described["device_name"], described["vram_gb"]) == (
        "gpu-max", "L40S", 48.0)
    assert described["simulated"] is True and described["gpu"]["totalGb"] == 48.0
    assert gpu_queue_for_vram(described["vram_gb"]) == "gpu.48g"  # the queue the worker serves


def test_a_simulated_small_card_with_a_budget_reports_lowvram():
    policy = policy_from_env({"INLINE_GPU_DESCRIPTION": L40S, "INLINE_VRAM_BUDGET_GB": "12"})
    assert (policy.describe()["profile"], policy.describe()["vram_gb"]) == ("lowvram", 12.0)


def test_the_cpu_profile_ignores_a_simulated_card():
    policy = policy_from_env({"INLINE_GPU_DESCRIPTION": L40S, "INLINE_PROFILE": "cpu"})
    assert policy.describe()["profile"] == "cpu" and "simulated" not in policy.describe()


def test_a_worker_pinned_by_index_or_uuid_finds_its_nvml_index():
    assert nvml.pinned_index({"CUDA_VISIBLE_DEVICES": "3"}) == 3
    assert nvml.pinned_index({"CUDA_VISIBLE_DEVICES": "2,3"}) == 2
    assert nvml.pinned_index({}) == 0
    assert nvml.pinned_index({"CUDA_VISIBLE_DEVICES": "GPU-0000"}) == 0  # no such card (or no NVML)
