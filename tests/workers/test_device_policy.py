"""The device policy: profiles, placements, detection and env overrides."""

from __future__ import annotations

import pytest

from workers.device import detect
from workers.device.detect import detect_policy, policy_from_env
from workers.device.policy import DevicePolicy, Placement


def fake_gpu(monkeypatch: pytest.MonkeyPatch, gb: float, bf16: bool = True) -> None:
    monkeypatch.setattr(detect, "_first_gpu", lambda: ("Fake GPU", gb, bf16))


def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(detect, "_first_gpu", lambda: None)


def test_a_machine_without_cuda_gets_the_cpu_profile_in_float32(monkeypatch):
    no_gpu(monkeypatch)
    policy = detect_policy()
    assert policy.profile == "cpu"
    assert policy.placement("denoiser") == Placement("cpu", "float32", offload=False)


def test_auto_detection_on_this_machine_matches_its_hardware():
    """CPU-only hosts get `cpu`; a CUDA host gets a GPU profile sized by its card's memory."""
    import torch

    policy = policy_from_env({})
    if not torch.cuda.is_available():
        assert (policy.profile, policy.device) == ("cpu", "cpu")
        return
    total_gb = torch.cuda.get_device_properties(0).total_memory / 2**30
    expected = "gpu-max" if total_gb >= detect.GPU_MAX_MIN_GB else "lowvram"
    assert (policy.profile, policy.device) == (expected, "cuda:0")
    assert policy.dtype == ("bfloat16" if torch.cuda.is_bf16_supported() else "float16")


def test_a_big_card_gets_gpu_max_in_bf16(monkeypatch):
    fake_gpu(monkeypatch, 80.0)
    policy = detect_policy()
    assert (policy.profile, policy.device, policy.dtype) == ("gpu-max", "cuda:0", "bfloat16")
    assert not policy.vae_tiling and not policy.cpu_offload
    assert policy.describe()["device_name"] == "Fake GPU"


def test_a_small_card_gets_lowvram_with_vae_tiling(monkeypatch):
    fake_gpu(monkeypatch, 12.0)
    policy = detect_policy()
    assert policy.profile == "lowvram"
    assert policy.vae_tiling and policy.vae_slicing


def test_a_vram_budget_caps_what_auto_detection_sees(monkeypatch):
    fake_gpu(monkeypatch, 80.0)
    policy = policy_from_env({"INLINE_VRAM_BUDGET_GB": "16"})
    assert (policy.profile, policy.vram_gb) == ("lowvram", 16.0)


def test_the_env_profile_overrides_detection(monkeypatch):
    fake_gpu(monkeypatch, 80.0)
    assert policy_from_env({"INLINE_PROFILE": "cpu"}).profile == "cpu"
    assert policy_from_env({"INLINE_PROFILE": "lowvram"}).profile == "lowvram"


def test_a_gpu_profile_without_a_gpu_is_a_clear_error(monkeypatch):
    no_gpu(monkeypatch)
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        policy_from_env({"INLINE_PROFILE": "gpu-max"})


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"INLINE_PROFILE": "turbo"}, "INLINE_PROFILE"),
        ({"INLINE_VRAM_BUDGET_GB": "lots"}, "INLINE_VRAM_BUDGET_GB"),
        ({"INLINE_VRAM_BUDGET_GB": "-1"}, "INLINE_VRAM_BUDGET_GB"),
        ({"INLINE_CPU_OFFLOAD": "maybe"}, "INLINE_CPU_OFFLOAD"),
    ],
)
def test_bad_env_values_fail_loudly(monkeypatch, env, message):
    no_gpu(monkeypatch)
    with pytest.raises(ValueError, match=message):
        policy_from_env(env)


def test_cpu_offload_is_only_on_when_asked_and_never_moves_the_denoiser(monkeypatch):
    fake_gpu(monkeypatch, 12.0)
    assert not policy_from_env({}).placement("text-encoder").offload
    policy = policy_from_env({"INLINE_CPU_OFFLOAD": "1"})
    assert policy.placement("text-encoder").offload and policy.placement("vae").offload
    assert not policy.placement("denoiser").offload


def test_a_card_without_bf16_runs_fp16_but_keeps_the_vae_in_fp32(monkeypatch):
    fake_gpu(monkeypatch, 24.0, bf16=False)
    policy = detect_policy()
    assert policy.placement("denoiser").dtype == "float16"
    assert policy.placement("vae").dtype == "float32"


def test_unknown_roles_and_inconsistent_policies_are_refused():
    with pytest.raises(ValueError, match="unknown model role"):
        DevicePolicy(profile="cpu").placement("unet")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        DevicePolicy(profile="gpu-max", device="cpu")
    with pytest.raises(ValueError, match="cannot place"):
        DevicePolicy(profile="cpu", device="cuda:0")


def test_a_placement_names_its_torch_dtype():
    import torch

    assert Placement("cpu", "bfloat16").torch_dtype is torch.bfloat16
