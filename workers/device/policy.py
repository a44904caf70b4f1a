"""The device policy: the one place that decides device, dtype and offload for every model role.

Torch-free on purpose (dtypes are names), so the web side may import it for typing; the worker
turns a name into a `torch.dtype` through `Placement.torch_dtype` at load time.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

Profile = Literal["gpu-max", "lowvram", "cpu"]
PROFILES: tuple[str, ...] = ("gpu-max", "lowvram", "cpu")
ROLES: tuple[str, ...] = ("denoiser", "text-encoder", "vae", "upscaler")
DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class Placement:
    """Where one model role lives: `device` ("cuda:0", "cpu"), `dtype` name, and `offload`
    (True: the weights rest in CPU memory and visit `device` only while they work)."""

    device: str
    dtype: str
    offload: bool = False

    @property
    def torch_dtype(self) -> Any:
        import torch

        return getattr(torch, self.dtype)


@dataclass(frozen=True)
class BatchBounds:
    """The most one batched forward may hold: `items` (a CFG job counts 2) and latent `tokens`
    (an item of W×H pixels is (W/16)·(H/16) tokens)."""

    items: int
    tokens: int

    def __post_init__(self) -> None:
        if self.items < 1 or self.tokens < 1:
            raise ValueError(f"batch bounds must be >= 1, got {self.items} items, "
                             f"{self.tokens} tokens")


@dataclass(frozen=True)
class DevicePolicy:
    """How this worker runs models. Built once per worker process (`detect.policy_from_env()`).

    Runners never name a device: they ask `placement(role)`.
    """

    profile: Profile
    device: str = "cpu"
    dtype: str = "float32"
    attention: str = "native"  # a diffusers attention backend name ("native" = torch SDPA)
    vae_tiling: bool = False
    vae_slicing: bool = False
    int8: bool = False
    cpu_offload: bool = False
    device_name: str = "cpu"
    vram_gb: float = 0.0
    batch_items: int = 0  # items per denoiser forward (a CFG job is 2); 0: the profile's default
    batch_tokens: int = 0  # latent tokens per forward (2×2 patches, all items); 0: default

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise ValueError(f"unknown device profile {self.profile!r}; expected one of {PROFILES}")
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; expected one of {DTYPES}")
        if self.profile == "cpu" and self.device != "cpu":
            raise ValueError(f"the cpu profile cannot place models on {self.device!r}")
        if self.profile != "cpu" and not self.device.startswith("cuda"):
            raise ValueError(f"profile {self.profile!r} needs a CUDA device, got {self.device!r}")

    def placement(self, role: str) -> Placement:
        """The placement of `role` ("denoiser", "text-encoder", "vae" or "upscaler": an
        upscale model, which visits the GPU as the encoders and the VAE do)."""
        if role not in ROLES:
            raise ValueError(f"unknown model role {role!r}; expected one of {ROLES}")
        dtype = self.dtype
        if role == "vae" and dtype == "float16":
            dtype = "float32"  # the Flux VAE overflows in fp16 (its config sets force_upcast)
        # The denoiser stays resident: it runs every step. Encoders and the VAE visit the GPU.
        offload = self.cpu_offload and role != "denoiser"
        return Placement(device=self.device, dtype=dtype, offload=offload)

    def batch_bounds(self) -> BatchBounds:
        """How much one batched forward (denoiser step, text encode, VAE decode) may hold.

        Defaults: CPU 16 items / 32k latent tokens (16 images of 512², cheap on RAM); a GPU
        ~1k tokens per usable GB (measured: the full-size transformer's transient activations
        are ~0.25 GB per 1024² item in bf16, so this leaves the weights and the VAE room);
        lowvram 4 items / 8k tokens. A job bigger than the budget alone still runs, alone.
        """
        if self.profile == "cpu":
            items, tokens = 16, 32 * 1024
        elif self.profile == "lowvram":
            items, tokens = 4, 8 * 1024
        else:
            items, tokens = 32, max(8 * 1024, int(self.vram_gb * 1024))
        return BatchBounds(self.batch_items or items, self.batch_tokens or tokens)

    def describe(self) -> dict[str, Any]:
        """A JSON-able summary for worker reports (profile, device name, VRAM GB, flags)."""
        return asdict(self)
