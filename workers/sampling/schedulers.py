"""ComfyUI's sigma schedulers over a family's model sampling (comfy/samplers.py
`calculate_sigmas`, comfy/model_sampling.py), for the generic samplers (workers/sampling/samplers.py).

A `ModelSampling` is what ComfyUI's `model_sampling` object is to its schedulers: the table of
the model's 1000 (FLUX: 10000) training sigmas, σ ↔ timestep, and how noise is scaled into a
latent. Two kinds, as ComfyUI's classes:
- `FlowSampling` (CONST: x = (1 − σ)·x0 + σ·ε): `ModelSamplingDiscreteFlow` with a shift (SD3,
  AuraFlow, Z-Image: shift 3) or `ModelSamplingFlux`'s resolution-dependent shift (mu).
- `DiscreteSampling` (EPS / V_PREDICTION, k-diffusion's x = x0 + σ·ε): `ModelSamplingDiscrete`
  from a beta schedule (SD 1.x / SDXL: scaled_linear 0.00085 → 0.012).

`timestep(σ)` answers in the convention a family's `predict` reads from `job.timesteps`
(diffusers' 0…1000 scale). Every schedule is float32 on CPU, ending in 0 (as ComfyUI's).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from apps.graphs.nodes import SCHEDULERS  # the names, declared once with the node types


@dataclass(frozen=True)
class FlowSampling:
    """CONST sampling (flow families). `flux`: ModelSamplingFlux (shift = mu, 10000 sigmas),
    else ModelSamplingDiscreteFlow (shift, 1000 sigmas)."""

    shift: float
    flux: bool = False
    const = True

    @property
    def sigmas(self) -> torch.Tensor:
        n = 10000 if self.flux else 1000
        return self.sigma(torch.arange(1, n + 1, 1) / n)  # [n], ascending

    def sigma(self, t: torch.Tensor) -> torch.Tensor:
        """σ of timestep t ∈ (0, 1] (ComfyUI's `sigma(timestep)` with multiplier 1)."""
        if self.flux:
            return math.exp(self.shift) / (math.exp(self.shift) + (1 / t - 1) ** 1.0)
        if self.shift == 1.0:
            return t
        return self.shift * t / (1 + (self.shift - 1) * t)

    def model_timestep(self, sigma: torch.Tensor) -> torch.Tensor:
        return sigma  # ComfyUI's `timestep(σ)` at multiplier 1

    @property
    def sigma_min(self) -> float:
        return float(self.sigmas[0])

    @property
    def sigma_max(self) -> float:
        return float(self.sigmas[-1])

    def percent_to_sigma(self, percent: float) -> float:
        if percent <= 0.0:
            return 1.0
        if percent >= 1.0:
            return 0.0
        return float(self.sigma(torch.tensor(1.0 - percent, dtype=torch.float64)))

    def timestep(self, sigma: torch.Tensor) -> torch.Tensor:
        """The families' job.timesteps: σ·1000 (FlowMatchEulerDiscreteScheduler's)."""
        return sigma * 1000

    def noise_scaling(self, sigma: torch.Tensor, noise: torch.Tensor,
                      latent: torch.Tensor, max_denoise: bool = False) -> torch.Tensor:
        return sigma * noise + (1.0 - sigma) * latent


@dataclass(frozen=True)
class DiscreteSampling:
    """EPS / V_PREDICTION sampling: ModelSamplingDiscrete's sigmas from a beta schedule."""

    linear_start: float = 0.00085
    linear_end: float = 0.012
    const = False

    @property
    def sigmas(self) -> torch.Tensor:
        betas = torch.linspace(self.linear_start ** 0.5, self.linear_end ** 0.5, 1000,
                               dtype=torch.float64) ** 2
        alphas_cumprod = torch.cumprod(1.0 - betas, dim=0).float()  # ComfyUI keeps float32
        return ((1 - alphas_cumprod) / alphas_cumprod) ** 0.5

    def model_timestep(self, sigma: torch.Tensor) -> torch.Tensor:
        """The nearest training timestep (ComfyUI's `timestep(σ)`)."""
        dists = sigma.log() - self.sigmas.log()[:, None]
        return dists.abs().argmin(dim=0).view(sigma.shape).float()

    def sigma(self, t: torch.Tensor) -> torch.Tensor:
        t = torch.clamp(t.float(), min=0.0, max=999.0)
        low, high = t.floor().long(), t.ceil().long()
        w = t.frac()
        log_sigmas = self.sigmas.log()
        return ((1 - w) * log_sigmas[low] + w * log_sigmas[high]).exp()

    @property
    def sigma_min(self) -> float:
        return float(self.sigmas[0])

    @property
    def sigma_max(self) -> float:
        return float(self.sigmas[-1])

    def percent_to_sigma(self, percent: float) -> float:
        if percent <= 0.0:
            return 999999999.9
        if percent >= 1.0:
            return 0.0
        return float(self.sigma(torch.tensor((1.0 - percent) * 999.0)))

    def timestep(self, sigma: torch.Tensor) -> torch.Tensor:
        return self.model_timestep(sigma)

    def noise_scaling(self, sigma: torch.Tensor, noise: torch.Tensor,
                      latent: torch.Tensor, max_denoise: bool = False) -> torch.Tensor:
        scale = torch.sqrt(1.0 + sigma ** 2.0) if max_denoise else sigma
        return noise * scale + latent


ModelSampling = FlowSampling | DiscreteSampling


def _append_zero(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x, x.new_zeros([1])])


def simple(ms: ModelSampling, steps: int) -> torch.Tensor:
    s = ms.sigmas
    stride = len(s) / steps
    sigs = [float(s[-(1 + int(x * stride))]) for x in range(steps)]
    return torch.FloatTensor([*sigs, 0.0])


def normal(ms: ModelSampling, steps: int, sgm: bool = False) -> torch.Tensor:
    start, end = ms.model_timestep(torch.tensor(ms.sigma_max)), ms.model_timestep(
        torch.tensor(ms.sigma_min))
    append_zero = True
    if sgm:
        timesteps = torch.linspace(float(start), float(end), steps + 1)[:-1]
    else:
        if math.isclose(float(ms.sigma(end)), 0, abs_tol=0.00001):
            steps += 1
            append_zero = False
        timesteps = torch.linspace(float(start), float(end), steps)
    sigs = [float(ms.sigma(ts)) for ts in timesteps]
    return torch.FloatTensor(sigs + ([0.0] if append_zero else []))


def karras(ms: ModelSampling, steps: int, rho: float = 7.0) -> torch.Tensor:
    ramp = torch.linspace(0, 1, steps)
    min_inv_rho, max_inv_rho = ms.sigma_min ** (1 / rho), ms.sigma_max ** (1 / rho)
    return _append_zero((max_inv_rho + ramp * (min_inv_rho - max_inv_rho)) ** rho)


def exponential(ms: ModelSampling, steps: int) -> torch.Tensor:
    sigmas = torch.linspace(math.log(ms.sigma_max), math.log(ms.sigma_min), steps).exp()
    return _append_zero(sigmas)


def beta(ms: ModelSampling, steps: int, alpha: float = 0.6, beta_: float = 0.6) -> torch.Tensor:
    table = ms.sigmas
    total = len(table) - 1
    sigs, last = [], -1
    for i in range(steps):
        t = round(beta_ppf(1.0 - i / steps, alpha, beta_) * total)  # numpy.rint: half to even
        if t != last:
            sigs.append(float(table[int(t)]))
        last = t
    return torch.FloatTensor([*sigs, 0.0])


SCHEDULE: dict[str, Callable[[ModelSampling, int], torch.Tensor]] = {
    "simple": simple,
    "normal": normal,
    "karras": karras,
    "exponential": exponential,
    "sgm_uniform": lambda ms, steps: normal(ms, steps, sgm=True),
    "beta": beta,
}
assert set(SCHEDULE) == set(SCHEDULERS), "apps/graphs/nodes.py SCHEDULERS names them all"


def calculate_sigmas(ms: ModelSampling, scheduler: str, steps: int) -> torch.Tensor:
    """ComfyUI's `calculate_sigmas`: [steps + 1] float32, ending in 0."""
    if scheduler not in SCHEDULE:
        raise ValueError(f"unknown scheduler {scheduler!r}; one of {', '.join(SCHEDULERS)}")
    return SCHEDULE[scheduler](ms, steps)


def sigmas_for(ms: ModelSampling, scheduler: str, steps: int, denoise: float = 1.0) -> torch.Tensor:
    """KSampler's / BasicScheduler's sigmas: the last `steps + 1` of a longer schedule when
    denoise < 1 (`int(steps / denoise)` steps in all)."""
    if denoise <= 0.0:
        raise ValueError("denoise 0 leaves no step to run")
    total = steps if denoise >= 1.0 else int(steps / denoise)
    return calculate_sigmas(ms, scheduler, total)[-(steps + 1):]


# --- the beta distribution's quantile (scipy.stats.beta.ppf, without scipy) -------------------


def beta_cdf(x: float, a: float, b: float) -> float:
    """The regularised incomplete beta I_x(a, b) (Lentz's continued fraction, Numerical
    Recipes' betai), to ~1e-15."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _beta_cf(x, a, b) / a
    return 1.0 - front * _beta_cf(1.0 - x, b, a) / b


def _beta_cf(x: float, a: float, b: float) -> float:
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-16:
            break
    return h


def beta_ppf(p: float, a: float, b: float) -> float:
    """x with I_x(a, b) = p, by bisection to float precision."""
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if beta_cdf(mid, a, b) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
