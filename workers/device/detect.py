"""Build the worker's `DevicePolicy` from the hardware and the environment.

Environment (read by `policy_from_env`, fail loud on bad values):
- `INLINE_PROFILE`: auto | gpu-max | lowvram | cpu (default auto: no CUDA -> cpu; a usable
  VRAM of at least `GPU_MAX_MIN_GB` -> gpu-max; less -> lowvram).
- `INLINE_VRAM_BUDGET_GB`: cap on the VRAM this worker may use (0 or unset = the whole card).
- `INLINE_CPU_OFFLOAD`: 1 to keep weights in CPU memory between uses (off unless asked).
- `INLINE_ATTENTION`: a diffusers attention backend name (default "native", torch SDPA).
- `INLINE_BATCH_ITEMS` / `INLINE_BATCH_TOKENS`: the most items (a CFG job is 2) and latent
  tokens one batched forward may hold (0 or unset = the profile's default, see
  `DevicePolicy.batch_bounds`).
- `INLINE_GPU_DESCRIPTION`: simulate this host's GPU (JSON, see `workers/device/nvml.py`): the
  worker reports and is routed to as that card, and computes on CPU.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from workers.device import nvml
from workers.device.policy import PROFILES, DevicePolicy

# Z-Image Turbo in bf16: transformer 11.5 GiB + Qwen3-4B 7.5 GiB + VAE + activations.
GPU_MAX_MIN_GB = 24.0


@dataclass(frozen=True)
class ReportingPolicy(DevicePolicy):
    """A policy that also tells the farm about its card: `describe()` adds `gpu` (the card's
    name, total / free / used GiB read live from NVML at every heartbeat, NVLink links).

    With `shown` (a simulated card, INLINE_GPU_DESCRIPTION), the worker computes as this policy
    says (CPU) but describes itself as `shown`, the policy that card would get, with
    `simulated: true`: the farm routes to it and serves its `gpu.<N>g` queue as for a real one.
    """

    gpu: nvml.Gpu | None = None
    shown: DevicePolicy | None = None

    def describe(self) -> dict[str, Any]:
        base = self.shown or self
        report = {f.name: getattr(base, f.name) for f in fields(DevicePolicy)}
        if self.gpu is not None:
            report["gpu"] = nvml.refreshed(self.gpu).to_report()
        if self.shown is not None:
            report["simulated"] = True
        return report


def policy_from_env(env: Mapping[str, str] | None = None) -> DevicePolicy:
    """The policy for this worker process, from `env` (default `os.environ`). Call once."""
    source: Mapping[str, str] = os.environ if env is None else env
    items = _count_env(source, "INLINE_BATCH_ITEMS")
    tokens = _count_env(source, "INLINE_BATCH_TOKENS")
    policy = replace(_policy_from_env(source), batch_items=items, batch_tokens=tokens)
    if isinstance(policy, ReportingPolicy) and policy.shown is not None:  # reported as set
        policy = replace(policy, shown=replace(policy.shown, batch_items=items,
                                               batch_tokens=tokens))
    return policy


def _policy_from_env(source: Mapping[str, str]) -> DevicePolicy:
    options: dict[str, Any] = dict(
        profile=source.get("INLINE_PROFILE", "auto") or "auto",
        vram_budget_gb=_float_env(source, "INLINE_VRAM_BUDGET_GB"),
        cpu_offload=_bool_env(source, "INLINE_CPU_OFFLOAD"),
        attention=source.get("INLINE_ATTENTION", "native") or "native",
    )
    raw = source.get("INLINE_GPU_DESCRIPTION", "").strip()
    if raw:
        return _simulated_policy(nvml.simulated_gpus(raw)[0], options)
    policy = detect_policy(**options)
    if policy.profile == "cpu":
        return policy
    gpu = nvml.nvml_gpu(nvml.pinned_index(source))
    return _reporting(policy, gpu=gpu) if gpu is not None else policy


def _simulated_policy(gpu: nvml.Gpu, options: dict[str, Any]) -> DevicePolicy:
    """Computes on CPU; describes itself as the policy `gpu` would get (unless profile=cpu)."""
    if options["profile"] == "cpu":
        return detect_policy(**options)
    shown = _policy_for(gpu=(gpu.name, gpu.total_gb, gpu.bf16), **options)
    runs = DevicePolicy(profile="cpu", attention=options["attention"])
    return _reporting(runs, gpu=gpu, shown=shown)


def _reporting(policy: DevicePolicy, **extra: Any) -> ReportingPolicy:
    return ReportingPolicy(**{f.name: getattr(policy, f.name) for f in fields(DevicePolicy)},
                           **extra)


def detect_policy(
    profile: str = "auto",
    vram_budget_gb: float = 0.0,
    *,
    cpu_offload: bool = False,
    attention: str = "native",
) -> DevicePolicy:
    """A policy for `profile` ("auto" picks from the hardware) on this machine's first GPU."""
    return _policy_for(profile=profile, vram_budget_gb=vram_budget_gb, cpu_offload=cpu_offload,
                       attention=attention, gpu=_first_gpu())


def _policy_for(
    *, profile: str, vram_budget_gb: float, cpu_offload: bool, attention: str,
    gpu: tuple[str, float, bool] | None,
) -> DevicePolicy:
    """`detect_policy` for a given `gpu` (name, total GiB, bf16 capable), or None (no GPU)."""
    if profile != "auto" and profile not in PROFILES:
        raise ValueError(f"INLINE_PROFILE must be auto or one of {PROFILES}, got {profile!r}")
    if vram_budget_gb < 0:
        raise ValueError(f"INLINE_VRAM_BUDGET_GB must be >= 0, got {vram_budget_gb}")
    if profile == "cpu" or (profile == "auto" and gpu is None):
        return DevicePolicy(profile="cpu", attention=attention, cpu_offload=False)
    if gpu is None:
        raise RuntimeError(f"INLINE_PROFILE={profile} needs a CUDA GPU, and torch sees none")
    name, total_gb, bf16 = gpu
    usable_gb = min(total_gb, vram_budget_gb) if vram_budget_gb > 0 else total_gb
    if profile == "auto":
        profile = "gpu-max" if usable_gb >= GPU_MAX_MIN_GB else "lowvram"
    low = profile == "lowvram"
    return DevicePolicy(
        profile=profile,  # type: ignore[arg-type]
        device="cuda:0",
        dtype="bfloat16" if bf16 else "float16",
        attention=attention,
        vae_tiling=low,
        vae_slicing=low,
        cpu_offload=cpu_offload,
        device_name=name,
        vram_gb=round(usable_gb, 1),
    )


def _first_gpu() -> tuple[str, float, bool] | None:
    """(name, total GiB, bf16 capable) of CUDA device 0, or None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return props.name, props.total_memory / 2**30, torch.cuda.is_bf16_supported()


def _float_env(env: Mapping[str, str], key: str) -> float:
    raw = env.get(key, "").strip()
    try:
        return float(raw) if raw else 0.0
    except ValueError:
        raise ValueError(f"{key} must be a number of GB, got {raw!r}") from None


def _count_env(env: Mapping[str, str], key: str) -> int:
    raw = env.get(key, "").strip()
    try:
        value = int(raw) if raw else 0
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{key} must be a whole number >= 0 (0 = the default), got {raw!r}")
    return value


def _bool_env(env: Mapping[str, str], key: str) -> bool:
    raw = env.get(key, "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise ValueError(f"{key} must be 0 or 1, got {raw!r}")
