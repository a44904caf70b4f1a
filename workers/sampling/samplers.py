"""ComfyUI's k-diffusion samplers, one job at a time, as evaluation points of the step batcher.

Each sampler is written as ComfyUI writes it (comfy/k_diffusion/sampling.py, and
comfy/extra_samplers/uni_pc.py for `uni_pc`) with one change: where the reference calls
`denoised = model(x, σ)`, the generator here does `denoised = yield x, σ, i` (step i) and the
step batcher answers it with the family's `to_denoised` of one shared forward. So a job's whole
sampler state (its x, old denoised, multistep history, noise generator) lives in its own
generator, and jobs of different samplers still share every forward (workers/sampling/batcher.py).

A sampler that evaluates the model more than once per step (heun, dpmpp_sde) yields more
evaluation points; `plan` finds them all before the job starts, by a dry run of the generator
on a 1-element latent (the branches of these samplers depend on the sigmas only), so the job's
`sigmas` / `timesteps` list every evaluation and `step_done` maps evaluations to steps.

Flow models use ComfyUI's CONST sampling (x = (1 − σ)·x0 + σ·ε): its `*_RF` ancestral step and
its half-log-SNR λ = log((1 − σ)/σ) in the SDE samplers, with the first σ = 1 nudged to
`percent_to_sigma(1e-4)`. ODE samplers are the same for both spaces (dx/dσ = (x − x0)/σ holds in
both). Noise, per job, so a seed gives the same image batched or solo: a CPU `torch.Generator`
seeded `seed + 1` (ComfyUI's `default_noise_sampler` on CPU); for the SDE samplers (dpmpp_sde,
dpmpp_2m_sde) ComfyUI's `BrownianTreeNoiseSampler`: a torchsde Brownian tree on the CPU over the
job's σ range, its entropy the noise seed, queried at each step's (σ, σ_next).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import torch

from apps.graphs.nodes import SAMPLERS  # the names, declared once with the node types
from workers.sampling.inpaint import NoiseMask
from workers.sampling.schedulers import ModelSampling

Noise = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # noise(σ, σ_next) like x
Sampler = Generator[tuple[torch.Tensor, torch.Tensor, int], torch.Tensor, torch.Tensor]


@dataclass
class Context:
    """What a sampler reads besides x and sigmas: the model sampling and the noise."""

    ms: ModelSampling
    noise: Noise


def to_d(x: torch.Tensor, sigma: torch.Tensor, denoised: torch.Tensor) -> torch.Tensor:
    return (x - denoised) / sigma


def get_ancestral_step(sigma_from: Any, sigma_to: Any, eta: float = 1.0) -> tuple[Any, Any]:
    if not eta:
        return sigma_to, 0.0
    sigma_up = min(sigma_to, eta * (sigma_to ** 2 * (sigma_from ** 2 - sigma_to ** 2)
                                    / sigma_from ** 2) ** 0.5)
    sigma_down = (sigma_to ** 2 - sigma_up ** 2) ** 0.5
    return sigma_down, sigma_up


def half_log_snr(sigma: torch.Tensor, ms: ModelSampling) -> torch.Tensor:
    return sigma.logit().neg() if ms.const else sigma.log().neg()


def sigma_of_half_log_snr(lam: torch.Tensor, ms: ModelSampling) -> torch.Tensor:
    return lam.neg().sigmoid() if ms.const else lam.neg().exp()


def offset_first_sigma(sigmas: torch.Tensor, ms: ModelSampling) -> torch.Tensor:
    if len(sigmas) <= 1 or not ms.const or sigmas[0] < 1:
        return sigmas
    sigmas = sigmas.clone()
    sigmas[0] = ms.percent_to_sigma(1e-4)
    return sigmas


# --- the samplers (ComfyUI's defaults: eta 1, s_noise 1, r ½, midpoint) ------------------------


def euler(x: torch.Tensor, sigmas: torch.Tensor, ctx: Context) -> Sampler:
    for i in range(len(sigmas) - 1):
        denoised = yield x, sigmas[i], i
        d = to_d(x, sigmas[i], denoised)
        x = x + d * (sigmas[i + 1] - sigmas[i])
    return x


def euler_ancestral(x: torch.Tensor, sigmas: torch.Tensor, ctx: Context) -> Sampler:
    if ctx.ms.const:
        return (yield from _euler_ancestral_rf(x, sigmas, ctx))
    for i in range(len(sigmas) - 1):
        denoised = yield x, sigmas[i], i
        sigma_down, sigma_up = get_ancestral_step(sigmas[i], sigmas[i + 1])
        if sigma_down == 0:
            x = denoised
        else:
            d = to_d(x, sigmas[i], denoised)
            x = x + d * (sigma_down - sigmas[i]) + ctx.noise(sigmas[i], sigmas[i + 1]) * sigma_up
    return x


def _euler_ancestral_rf(x: torch.Tensor, sigmas: torch.Tensor, ctx: Context,
                        eta: float = 1.0) -> Sampler:
    for i in range(len(sigmas) - 1):
        denoised = yield x, sigmas[i], i
        if sigmas[i + 1] == 0:
            x = denoised
            continue
        downstep_ratio = 1 + (sigmas[i + 1] / sigmas[i] - 1) * eta
        sigma_down = sigmas[i + 1] * downstep_ratio
        alpha_ip1, alpha_down = 1 - sigmas[i + 1], 1 - sigma_down
        renoise = (sigmas[i + 1] ** 2 - sigma_down ** 2 * alpha_ip1 ** 2 / alpha_down ** 2) ** 0.5
        ratio = sigma_down / sigmas[i]
        x = ratio * x + (1 - ratio) * denoised
        if eta > 0:
            x = (alpha_ip1 / alpha_down) * x + ctx.noise(sigmas[i], sigmas[i + 1]) * renoise
    return x


def heun(x: torch.Tensor, sigmas: torch.Tensor, ctx: Context) -> Sampler:
    for i in range(len(sigmas) - 1):
        denoised = yield x, sigmas[i], i
        d = to_d(x, sigmas[i], denoised)
        dt = sigmas[i + 1] - sigmas[i]
        if sigmas[i + 1] == 0:
            x = x + d * dt
        else:
            x_2 = x + d * dt
            denoised_2 = yield x_2, sigmas[i + 1], i
            d_2 = to_d(x_2, sigmas[i + 1], denoised_2)
            x = x + (d + d_2) / 2 * dt
    return x


def dpmpp_2m(x: torch.Tensor, sigmas: torch.Tensor, ctx: Context) -> Sampler:
    def sigma_fn(t: torch.Tensor) -> torch.Tensor:
        return t.neg().exp()

    def t_fn(sigma: torch.Tensor) -> torch.Tensor:
        return sigma.log().neg()

    old_denoised = None
    for i in range(len(sigmas) - 1):
        denoised = yield x, sigmas[i], i
        t, t_next = t_fn(sigmas[i]), t_fn(sigmas[i + 1])
        h = t_next - t
        if old_denoised is None or sigmas[i + 1] == 0:
            x = (sigma_fn(t_next) / sigma_fn(t)) * x - (-h).expm1() * denoised
        else:
            r = (t - t_fn(sigmas[i - 1])) / h
            denoised_d = (1 + 1 / (2 * r)) * denoised - (1 / (2 * r)) * old_denoised
            x = (sigma_fn(t_next) / sigma_fn(t)) * x - (-h).expm1() * denoised_d
        old_denoised = denoised
    return x


def dpmpp_2m_sde(x: torch.Tensor, sigmas: torch.Tensor, ctx: Context,
                 eta: float = 1.0) -> Sampler:
    sigmas = offset_first_sigma(sigmas, ctx.ms)
    old_denoised: Any = None
    h: Any = None
    h_last: Any = None
    for i in range(len(sigmas) - 1):
        denoised = yield x, sigmas[i], i
        if sigmas[i + 1] == 0:
            x = denoised
        else:
            lambda_s, lambda_t = half_log_snr(sigmas[i], ctx.ms), half_log_snr(sigmas[i + 1], ctx.ms)
            h = lambda_t - lambda_s
            h_eta = h * (eta + 1)
            alpha_t = sigmas[i + 1] * lambda_t.exp()
            x = (sigmas[i + 1] / sigmas[i] * (-h * eta).exp() * x
                 + alpha_t * (-h_eta).expm1().neg() * denoised)
            if old_denoised is not None:
                r = h_last / h
                x = x + 0.5 * alpha_t * (-h_eta).expm1().neg() * (1 / r) * (denoised - old_denoised)
            noise = ctx.noise(sigmas[i], sigmas[i + 1])
            x = x + noise * sigmas[i + 1] * (-2 * h * eta).expm1().neg().sqrt()
        old_denoised, h_last = denoised, h
    return x


def dpmpp_sde(x: torch.Tensor, sigmas: torch.Tensor, ctx: Context, eta: float = 1.0,
              r: float = 1 / 2) -> Sampler:
    ms = ctx.ms
    sigmas = offset_first_sigma(sigmas, ms)
    for i in range(len(sigmas) - 1):
        denoised = yield x, sigmas[i], i
        if sigmas[i + 1] == 0:
            x = denoised
            continue
        lambda_s, lambda_t = half_log_snr(sigmas[i], ms), half_log_snr(sigmas[i + 1], ms)
        h = lambda_t - lambda_s
        lambda_s_1 = lambda_s + r * h
        fac = 1 / (2 * r)
        sigma_s_1 = sigma_of_half_log_snr(lambda_s_1, ms)
        alpha_s = sigmas[i] * lambda_s.exp()
        alpha_s_1 = sigma_s_1 * lambda_s_1.exp()
        alpha_t = sigmas[i + 1] * lambda_t.exp()
        # Step 1
        sd, su = get_ancestral_step(lambda_s.neg().exp(), lambda_s_1.neg().exp(), eta)
        h_ = sd.log().neg() - lambda_s
        x_2 = (alpha_s_1 / alpha_s) * (-h_).exp() * x - alpha_s_1 * (-h_).expm1() * denoised
        x_2 = x_2 + alpha_s_1 * ctx.noise(sigmas[i], sigma_s_1) * su
        denoised_2 = yield x_2, sigma_s_1, i
        # Step 2
        sd, su = get_ancestral_step(lambda_s.neg().exp(), lambda_t.neg().exp(), eta)
        h_ = sd.log().neg() - lambda_s
        denoised_d = (1 - fac) * denoised + fac * denoised_2
        x = (alpha_t / alpha_s) * (-h_).exp() * x - alpha_t * (-h_).expm1() * denoised_d
        x = x + alpha_t * ctx.noise(sigmas[i], sigmas[i + 1]) * su
    return x


def res_multistep(x: torch.Tensor, sigmas: torch.Tensor, ctx: Context) -> Sampler:
    """ComfyUI's `sample_res_multistep` (eta 0: no noise is added)."""
    def sigma_fn(t: torch.Tensor) -> torch.Tensor:
        return t.neg().exp()

    def t_fn(sigma: torch.Tensor) -> torch.Tensor:
        return sigma.log().neg()

    def phi1_fn(t: torch.Tensor) -> torch.Tensor:
        return torch.expm1(t) / t

    def phi2_fn(t: torch.Tensor) -> torch.Tensor:
        return (phi1_fn(t) - 1.0) / t

    old_sigma_down: Any = None
    old_denoised: Any = None
    for i in range(len(sigmas) - 1):
        denoised = yield x, sigmas[i], i
        sigma_down = sigmas[i + 1]  # get_ancestral_step at eta 0
        if sigma_down == 0 or old_denoised is None:
            x = x + to_d(x, sigmas[i], denoised) * (sigma_down - sigmas[i])
        else:
            t, t_old = t_fn(sigmas[i]), t_fn(old_sigma_down)
            t_next, t_prev = t_fn(sigma_down), t_fn(sigmas[i - 1])
            h = t_next - t
            c2 = (t_prev - t_old) / h
            phi1_val, phi2_val = phi1_fn(-h), phi2_fn(-h)
            b1 = torch.nan_to_num(phi1_val - phi2_val / c2, nan=0.0)
            b2 = torch.nan_to_num(phi2_val / c2, nan=0.0)
            x = sigma_fn(h) * x + h * (b1 * denoised + b2 * old_denoised)
        old_denoised, old_sigma_down = denoised, sigma_down
    return x


def lcm(x: torch.Tensor, sigmas: torch.Tensor, ctx: Context) -> Sampler:
    for i in range(len(sigmas) - 1):
        x = yield x, sigmas[i], i
        if sigmas[i + 1] > 0:
            x = ctx.ms.noise_scaling(sigmas[i + 1], ctx.noise(sigmas[i], sigmas[i + 1]), x)
    return x


# --- UniPC (bh1), as comfy/extra_samplers/uni_pc.py runs it: multistep, predict x0 --------------


class _SigmaConvert:
    """uni_pc.py's SigmaConvert: k-diffusion σ as a VP schedule's time."""

    @staticmethod
    def log_mean_coeff(sigma: torch.Tensor) -> torch.Tensor:
        return 0.5 * torch.log(1 / ((sigma * sigma) + 1))

    def alpha(self, t: torch.Tensor) -> torch.Tensor:
        return torch.exp(self.log_mean_coeff(t))

    def std(self, t: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(1.0 - torch.exp(2.0 * self.log_mean_coeff(t)))

    def lam(self, t: torch.Tensor) -> torch.Tensor:
        log_mean_coeff = self.log_mean_coeff(t)
        return log_mean_coeff - 0.5 * torch.log(1.0 - torch.exp(2.0 * log_mean_coeff))


_NS = _SigmaConvert()


def uni_pc(x: torch.Tensor, sigmas: torch.Tensor, ctx: Context) -> Sampler:
    timesteps = sigmas.clone()
    if sigmas[-1] < 0.001:
        timesteps[-1] = 0.001
    x = x / torch.sqrt(1.0 + timesteps[0] ** 2.0)
    steps = len(timesteps) - 1
    order = min(3, len(timesteps) - 2)
    model_prev: list[torch.Tensor] = []
    t_prev: list[torch.Tensor] = []
    for step_index in range(steps):
        if step_index == 0:
            model_prev, t_prev = [(yield from _unipc_x0(x, timesteps[0], 0))], [timesteps[0]]
        elif step_index < order:
            t = timesteps[step_index]
            x, model_x = yield from _unipc_update(x, model_prev, t_prev, t, step_index, True,
                                                  step_index)
            model_prev.append(model_x)
            t_prev.append(t)
        else:
            final = 1 if step_index == steps - 1 else 0
            for step in range(step_index, step_index + 1 + final):
                t = timesteps[step]
                step_order = min(order, steps + 1 - step)
                x, model_x = yield from _unipc_update(x, model_prev, t_prev, t, step_order,
                                                      step != steps, step_index)
                for i in range(order - 1):
                    t_prev[i], model_prev[i] = t_prev[i + 1], model_prev[i + 1]
                t_prev[-1] = t
                if step < steps:
                    model_prev[-1] = model_x
    return x / _NS.alpha(timesteps[-1])


def _unipc_x0(x: torch.Tensor, t: torch.Tensor, i: int) -> Sampler:
    """The data prediction at VP latents x, time (σ) t: predict_eps_sigma, then x0."""
    x_in = x * ((t ** 2 + 1.0) ** 0.5)
    denoised = yield x_in, t, i
    eps = (x_in - denoised) / t
    return (x - _NS.std(t) * eps) / _NS.alpha(t)


def _unipc_update(x: torch.Tensor, model_prev: list[torch.Tensor], t_prev: list[torch.Tensor],
                  t: torch.Tensor, order: int, use_corrector: bool, i: int) -> Any:
    """multistep_uni_pc_bh_update, variant bh1, predict_x0."""
    t_prev_0, model_prev_0 = t_prev[-1], model_prev[-1]
    lambda_prev_0, lambda_t = _NS.lam(t_prev_0), _NS.lam(t)
    sigma_prev_0, sigma_t = _NS.std(t_prev_0), _NS.std(t)
    alpha_t = torch.exp(_NS.log_mean_coeff(t))
    h = lambda_t - lambda_prev_0
    rks: list[Any] = []
    d1s: list[torch.Tensor] = []
    for k in range(1, order):
        rk = (_NS.lam(t_prev[-(k + 1)]) - lambda_prev_0) / h
        rks.append(rk)
        d1s.append((model_prev[-(k + 1)] - model_prev_0) / rk)
    rks.append(1.0)
    rks_t = torch.tensor(rks, device=x.device)
    hh = -h
    h_phi_1 = torch.expm1(hh)
    h_phi_k = h_phi_1 / hh - 1
    factorial_i = 1
    b_h = hh  # bh1
    big_r, b = [], []
    for k in range(1, order + 1):
        big_r.append(torch.pow(rks_t, k - 1))
        b.append(h_phi_k * factorial_i / b_h)
        factorial_i *= k + 1
        h_phi_k = h_phi_k / hh - 1 / factorial_i
    r_mat, b_vec = torch.stack(big_r), torch.tensor(b, device=x.device)
    stacked = torch.stack(d1s, dim=1) if d1s else None
    x_t_ = (sigma_t / sigma_prev_0) * x - (alpha_t * h_phi_1) * model_prev_0
    pred_res: Any = 0
    if stacked is not None:
        rhos_p = (torch.tensor([0.5], device=x.device) if order == 2
                  else torch.linalg.solve(r_mat[:-1, :-1], b_vec[:-1]))
        pred_res = torch.einsum("k,bkchw->bchw", rhos_p, stacked)
    x_t = x_t_ - (alpha_t * b_h) * pred_res
    model_t = None
    if use_corrector:
        rhos_c = (torch.tensor([0.5], device=x.device) if order == 1
                  else torch.linalg.solve(r_mat, b_vec))
        model_t = yield from _unipc_x0(x_t, t, i)
        corr_res: Any = 0
        if stacked is not None:
            corr_res = torch.einsum("k,bkchw->bchw", rhos_c[:-1], stacked)
        x_t = x_t_ - (alpha_t * b_h) * (corr_res + rhos_c[-1] * (model_t - model_prev_0))
    return x_t, model_t


SAMPLER_FUNCTIONS: dict[str, Callable[[torch.Tensor, torch.Tensor, Context], Sampler]] = {
    "euler": euler, "euler_ancestral": euler_ancestral, "heun": heun, "dpmpp_2m": dpmpp_2m,
    "dpmpp_2m_sde": dpmpp_2m_sde, "dpmpp_sde": dpmpp_sde, "res_multistep": res_multistep,
    "uni_pc": uni_pc, "lcm": lcm,
}
assert set(SAMPLER_FUNCTIONS) == set(SAMPLERS), "apps/graphs/nodes.py SAMPLERS names them all"


# --- a job's sampler, stepped by the batcher ---------------------------------------------------


def seeded_noise(seed: int, like: torch.Tensor) -> Noise:
    """ComfyUI's default_noise_sampler on CPU: `randn(x.size())` from a CPU generator seeded
    seed + 1, moved to x's device (the same draws whatever the device)."""
    generator = torch.Generator("cpu").manual_seed(seed + 1)
    size, dtype, device = like.size(), like.dtype, like.device

    def noise(sigma: torch.Tensor, sigma_next: torch.Tensor) -> torch.Tensor:
        return torch.randn(size, dtype=dtype, generator=generator).to(device)

    return noise


BROWNIAN = frozenset({"dpmpp_sde", "dpmpp_2m_sde"})  # ComfyUI draws their noise from a tree


def brownian_noise(seed: int, like: torch.Tensor, sigmas: torch.Tensor) -> Noise:
    """ComfyUI's `BrownianTreeNoiseSampler(x, σ_min, σ_max, seed, cpu=True)`: a torchsde
    BrownianTree on the CPU over [smallest σ > 0, largest σ] of the schedule, starting at zeros
    shaped like `like`, with entropy `seed`; `noise(σ, σ_next)` is the tree's increment over the
    two, signed by their order, over √|σ_next − σ| (unit variance), moved to like's device."""
    import torchsde  # the worker extra's; imported only by SDE sampling

    lo, hi = sigmas[sigmas > 0].min().float().cpu(), sigmas.max().float().cpu()
    tree_sign = 1 if lo < hi else -1  # BatchedBrownianTree.sort (equal: no step draws noise)
    lo, hi = (lo, hi) if lo < hi else (hi, lo)
    zeros = torch.zeros(like.size(), dtype=like.dtype)
    tree = torchsde.BrownianTree(lo, zeros, hi, entropy=seed)
    device = like.device

    def noise(sigma: torch.Tensor, sigma_next: torch.Tensor) -> torch.Tensor:
        t0, t1 = torch.as_tensor(sigma), torch.as_tensor(sigma_next)
        a, b, sign = (t0, t1, 1) if t0 < t1 else (t1, t0, -1)
        w = tree(a.detach().cpu().float(), b.detach().cpu().float()).to(dtype=t0.dtype)
        return (w * (tree_sign * sign) / (t1 - t0).abs().sqrt()).to(device)

    return noise


def _zero_noise(sigma: torch.Tensor, sigma_next: torch.Tensor) -> torch.Tensor:
    return torch.zeros([1, 1, 1, 1])


@dataclass
class Plan:
    """A job's evaluations: `sigmas` [evaluations + 1] (each evaluation's σ, then the last σ of
    the schedule), `step_done[e]` the steps complete after evaluation e."""

    sigmas: torch.Tensor
    step_done: tuple[int, ...]


def plan(name: str, sigmas: torch.Tensor, ms: ModelSampling) -> Plan:
    """The evaluation points of sampler `name` over `sigmas`, by a dry run on one element."""
    if name not in SAMPLER_FUNCTIONS:
        raise ValueError(f"unknown sampler {name!r}; one of {', '.join(SAMPLERS)}")
    x = torch.zeros([1, 1, 1, 1])
    run = SAMPLER_FUNCTIONS[name](x, sigmas.float().cpu(), Context(ms, _zero_noise))
    evals: list[torch.Tensor] = []
    tags: list[int] = []
    try:
        x_eval, sigma, i = next(run)
        while True:
            evals.append(sigma.reshape(()))
            tags.append(i)
            x_eval, sigma, i = run.send(torch.zeros_like(x_eval))
    except StopIteration:
        pass
    if not evals:
        raise ValueError("the sigmas leave no step to run")
    done = tuple(tag + 1 if e + 1 == len(tags) or tags[e + 1] > tag else tag
                 for e, tag in enumerate(tags))
    return Plan(torch.stack([*evals, sigmas[-1].float().cpu().reshape(())]), done)


@dataclass(eq=False)
class Stepper:
    """One job's running sampler: `start(x)` gives the latents of its first evaluation;
    `advance(job, output)` (the SampleJob's `advance`) turns the forward's output into the
    latents of the next evaluation (or the result, after the last). Re-entrant per step: a
    batch retried after a failure gets the same answer for a step already advanced."""

    name: str
    sigmas: torch.Tensor  # the schedule (not the evaluations)
    ms: ModelSampling
    seed: int
    to_denoised: Callable[[Any, torch.Tensor], torch.Tensor]
    denoised: torch.Tensor | None = field(default=None, repr=False)  # the last x0 estimate
    inpaint: NoiseMask | None = None  # ComfyUI's noise-mask sampling (workers/sampling/inpaint.py)
    _sigma: torch.Tensor = field(default_factory=lambda: torch.zeros(()), repr=False)  # next eval's σ
    _run: Sampler | None = field(default=None, repr=False)
    _done: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)

    def start(self, x: torch.Tensor) -> torch.Tensor:
        sigmas = self.sigmas.float().cpu()
        noise = (brownian_noise(self.seed, x, sigmas) if self.name in BROWNIAN
                 else seeded_noise(self.seed, x))
        # The sigmas stay on the CPU (0-d tensors mix with any device's), so the generator
        # computes each evaluation's σ exactly as `plan` did.
        self._run = SAMPLER_FUNCTIONS[self.name](x, sigmas, Context(self.ms, noise))
        first, self._sigma, _ = next(self._run)
        return self._model_input(first)

    def advance(self, job: Any, output: torch.Tensor) -> torch.Tensor:
        if job.step in self._done:
            return self._done[job.step]
        assert self._run is not None, "start the stepper first"
        denoised = self.to_denoised(job, output)
        if self.inpaint is not None:
            denoised = self.inpaint.denoised(denoised, self._sigma)
        self.denoised = denoised
        try:
            x, self._sigma, _ = self._run.send(denoised)
            x = self._model_input(x)
        except StopIteration as end:
            x = end.value
        self._done = {job.step: x}
        return x

    def _model_input(self, x: torch.Tensor) -> torch.Tensor:
        """The evaluation's x as the model sees it: a noise mask's kept part put in."""
        return x if self.inpaint is None else self.inpaint.model_input(x, self._sigma)


def eval_timesteps(evals: torch.Tensor, ms: ModelSampling) -> torch.Tensor:
    """The job's timesteps [evaluations] for its evaluation sigmas (the families' convention)."""
    return ms.timestep(evals[:-1])
