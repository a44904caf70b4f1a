# mypy: ignore-errors
# (ComfyUI's code as it is written: untyped, names reused across types)
"""ComfyUI's samplers transcribed as ComfyUI writes them (comfy/k_diffusion/sampling.py and
comfy/extra_samplers/uni_pc.py, default arguments), looping over `model(x, sigma)`: the reference
the farm's generator samplers (workers/sampling/samplers.py) are compared against. `ms` stands for
ComfyUI's model_sampling (CONST when `ms.const`), `noise_sampler(σ, σ_next)` for its noise."""

from __future__ import annotations

from functools import partial

import torch


def to_d(x, sigma, denoised):
    return (x - denoised) / sigma


def get_ancestral_step(sigma_from, sigma_to, eta=1.0):
    if not eta:
        return sigma_to, 0.0
    sigma_up = min(sigma_to, eta * (sigma_to ** 2 * (sigma_from ** 2 - sigma_to ** 2) / sigma_from ** 2) ** 0.5)
    sigma_down = (sigma_to ** 2 - sigma_up ** 2) ** 0.5
    return sigma_down, sigma_up


def sigma_to_half_log_snr(sigma, ms):
    return sigma.logit().neg() if ms.const else sigma.log().neg()


def half_log_snr_to_sigma(half_log_snr, ms):
    return half_log_snr.neg().sigmoid() if ms.const else half_log_snr.neg().exp()


def offset_first_sigma_for_snr(sigmas, ms, percent_offset=1e-4):
    if len(sigmas) <= 1:
        return sigmas
    if ms.const and sigmas[0] >= 1:
        sigmas = sigmas.clone()
        sigmas[0] = ms.percent_to_sigma(percent_offset)
    return sigmas


def sample_euler(model, x, sigmas, ms, noise_sampler):
    for i in range(len(sigmas) - 1):
        denoised = model(x, sigmas[i])
        d = to_d(x, sigmas[i], denoised)
        dt = sigmas[i + 1] - sigmas[i]
        x = x + d * dt
    return x


def sample_euler_ancestral(model, x, sigmas, ms, noise_sampler, eta=1.0, s_noise=1.0):
    if ms.const:
        return sample_euler_ancestral_RF(model, x, sigmas, ms, noise_sampler)
    for i in range(len(sigmas) - 1):
        denoised = model(x, sigmas[i])
        sigma_down, sigma_up = get_ancestral_step(sigmas[i], sigmas[i + 1], eta=eta)
        if sigma_down == 0:
            x = denoised
        else:
            d = to_d(x, sigmas[i], denoised)
            dt = sigma_down - sigmas[i]
            x = x + d * dt + noise_sampler(sigmas[i], sigmas[i + 1]) * s_noise * sigma_up
    return x


def sample_euler_ancestral_RF(model, x, sigmas, ms, noise_sampler, eta=1.0, s_noise=1.0):
    for i in range(len(sigmas) - 1):
        denoised = model(x, sigmas[i])
        if sigmas[i + 1] == 0:
            x = denoised
        else:
            downstep_ratio = 1 + (sigmas[i + 1] / sigmas[i] - 1) * eta
            sigma_down = sigmas[i + 1] * downstep_ratio
            alpha_ip1 = 1 - sigmas[i + 1]
            alpha_down = 1 - sigma_down
            renoise_coeff = (sigmas[i + 1]**2 - sigma_down**2 * alpha_ip1**2 / alpha_down**2)**0.5
            sigma_down_i_ratio = sigma_down / sigmas[i]
            x = sigma_down_i_ratio * x + (1 - sigma_down_i_ratio) * denoised
            if eta > 0:
                x = (alpha_ip1 / alpha_down) * x + noise_sampler(sigmas[i], sigmas[i + 1]) * s_noise * renoise_coeff
    return x


def sample_heun(model, x, sigmas, ms, noise_sampler):
    for i in range(len(sigmas) - 1):
        sigma_hat = sigmas[i]
        denoised = model(x, sigma_hat)
        d = to_d(x, sigma_hat, denoised)
        dt = sigmas[i + 1] - sigma_hat
        if sigmas[i + 1] == 0:
            x = x + d * dt
        else:
            x_2 = x + d * dt
            denoised_2 = model(x_2, sigmas[i + 1])
            d_2 = to_d(x_2, sigmas[i + 1], denoised_2)
            d_prime = (d + d_2) / 2
            x = x + d_prime * dt
    return x


def sample_dpmpp_sde(model, x, sigmas, ms, noise_sampler, eta=1.0, s_noise=1.0, r=1 / 2):
    sigma_fn = partial(half_log_snr_to_sigma, ms=ms)
    lambda_fn = partial(sigma_to_half_log_snr, ms=ms)
    sigmas = offset_first_sigma_for_snr(sigmas, ms)
    for i in range(len(sigmas) - 1):
        denoised = model(x, sigmas[i])
        if sigmas[i + 1] == 0:
            x = denoised
        else:
            lambda_s, lambda_t = lambda_fn(sigmas[i]), lambda_fn(sigmas[i + 1])
            h = lambda_t - lambda_s
            lambda_s_1 = lambda_s + r * h
            fac = 1 / (2 * r)
            sigma_s_1 = sigma_fn(lambda_s_1)
            alpha_s = sigmas[i] * lambda_s.exp()
            alpha_s_1 = sigma_s_1 * lambda_s_1.exp()
            alpha_t = sigmas[i + 1] * lambda_t.exp()
            sd, su = get_ancestral_step(lambda_s.neg().exp(), lambda_s_1.neg().exp(), eta)
            lambda_s_1_ = sd.log().neg()
            h_ = lambda_s_1_ - lambda_s
            x_2 = (alpha_s_1 / alpha_s) * (-h_).exp() * x - alpha_s_1 * (-h_).expm1() * denoised
            if eta > 0 and s_noise > 0:
                x_2 = x_2 + alpha_s_1 * noise_sampler(sigmas[i], sigma_s_1) * s_noise * su
            denoised_2 = model(x_2, sigma_s_1)
            sd, su = get_ancestral_step(lambda_s.neg().exp(), lambda_t.neg().exp(), eta)
            lambda_t_ = sd.log().neg()
            h_ = lambda_t_ - lambda_s
            denoised_d = (1 - fac) * denoised + fac * denoised_2
            x = (alpha_t / alpha_s) * (-h_).exp() * x - alpha_t * (-h_).expm1() * denoised_d
            if eta > 0 and s_noise > 0:
                x = x + alpha_t * noise_sampler(sigmas[i], sigmas[i + 1]) * s_noise * su
    return x


def sample_dpmpp_2m(model, x, sigmas, ms, noise_sampler):
    sigma_fn = lambda t: t.neg().exp()
    t_fn = lambda sigma: sigma.log().neg()
    old_denoised = None
    for i in range(len(sigmas) - 1):
        denoised = model(x, sigmas[i])
        t, t_next = t_fn(sigmas[i]), t_fn(sigmas[i + 1])
        h = t_next - t
        if old_denoised is None or sigmas[i + 1] == 0:
            x = (sigma_fn(t_next) / sigma_fn(t)) * x - (-h).expm1() * denoised
        else:
            h_last = t - t_fn(sigmas[i - 1])
            r = h_last / h
            denoised_d = (1 + 1 / (2 * r)) * denoised - (1 / (2 * r)) * old_denoised
            x = (sigma_fn(t_next) / sigma_fn(t)) * x - (-h).expm1() * denoised_d
        old_denoised = denoised
    return x


def sample_dpmpp_2m_sde(model, x, sigmas, ms, noise_sampler, eta=1.0, s_noise=1.0):
    lambda_fn = partial(sigma_to_half_log_snr, ms=ms)
    sigmas = offset_first_sigma_for_snr(sigmas, ms)
    old_denoised = None
    h, h_last = None, None
    for i in range(len(sigmas) - 1):
        denoised = model(x, sigmas[i])
        if sigmas[i + 1] == 0:
            x = denoised
        else:
            lambda_s, lambda_t = lambda_fn(sigmas[i]), lambda_fn(sigmas[i + 1])
            h = lambda_t - lambda_s
            h_eta = h * (eta + 1)
            alpha_t = sigmas[i + 1] * lambda_t.exp()
            x = sigmas[i + 1] / sigmas[i] * (-h * eta).exp() * x + alpha_t * (-h_eta).expm1().neg() * denoised
            if old_denoised is not None:
                r = h_last / h
                x = x + 0.5 * alpha_t * (-h_eta).expm1().neg() * (1 / r) * (denoised - old_denoised)
            if eta > 0 and s_noise > 0:
                x = x + noise_sampler(sigmas[i], sigmas[i + 1]) * sigmas[i + 1] * (-2 * h * eta).expm1().neg().sqrt() * s_noise
        old_denoised = denoised
        h_last = h
    return x


def sample_res_multistep(model, x, sigmas, ms, noise_sampler, s_noise=1.0, eta=0.0):
    sigma_fn = lambda t: t.neg().exp()
    t_fn = lambda sigma: sigma.log().neg()
    phi1_fn = lambda t: torch.expm1(t) / t
    phi2_fn = lambda t: (phi1_fn(t) - 1.0) / t
    old_sigma_down = None
    old_denoised = None
    for i in range(len(sigmas) - 1):
        denoised = model(x, sigmas[i])
        sigma_down, sigma_up = get_ancestral_step(sigmas[i], sigmas[i + 1], eta=eta)
        if sigma_down == 0 or old_denoised is None:
            d = to_d(x, sigmas[i], denoised)
            dt = sigma_down - sigmas[i]
            x = x + d * dt
        else:
            t, t_old, t_next, t_prev = t_fn(sigmas[i]), t_fn(old_sigma_down), t_fn(sigma_down), t_fn(sigmas[i - 1])
            h = t_next - t
            c2 = (t_prev - t_old) / h
            phi1_val, phi2_val = phi1_fn(-h), phi2_fn(-h)
            b1 = torch.nan_to_num(phi1_val - phi2_val / c2, nan=0.0)
            b2 = torch.nan_to_num(phi2_val / c2, nan=0.0)
            x = sigma_fn(h) * x + h * (b1 * denoised + b2 * old_denoised)
        if sigmas[i + 1] > 0:
            x = x + noise_sampler(sigmas[i], sigmas[i + 1]) * s_noise * sigma_up
        old_denoised = denoised
        old_sigma_down = sigma_down
    return x


def sample_lcm(model, x, sigmas, ms, noise_sampler):
    for i in range(len(sigmas) - 1):
        denoised = model(x, sigmas[i])
        x = denoised
        if sigmas[i + 1] > 0:
            x = ms.noise_scaling(sigmas[i + 1], noise_sampler(sigmas[i], sigmas[i + 1]), x)
    return x


# --- uni_pc.py: SigmaConvert, the model wrapper (noise), UniPC.sample (multistep, bh1) ----------


class SigmaConvert:
    def marginal_log_mean_coeff(self, sigma):
        return 0.5 * torch.log(1 / ((sigma * sigma) + 1))

    def marginal_alpha(self, t):
        return torch.exp(self.marginal_log_mean_coeff(t))

    def marginal_std(self, t):
        return torch.sqrt(1. - torch.exp(2. * self.marginal_log_mean_coeff(t)))

    def marginal_lambda(self, t):
        log_mean_coeff = self.marginal_log_mean_coeff(t)
        log_std = 0.5 * torch.log(1. - torch.exp(2. * log_mean_coeff))
        return log_mean_coeff - log_std


def expand_dims(v, dims):
    return v[(...,) + (None,) * (dims - 1)]


class UniPC:
    def __init__(self, model, ns):
        self.model, self.noise_schedule, self.variant = model, ns, "bh1"

    def model_fn(self, x, t):  # data_prediction_fn over predict_eps_sigma
        sigma = t.view(t.shape[:1] + (1,) * (x.ndim - 1))
        x_in = x * ((sigma ** 2 + 1.0) ** 0.5)
        noise = (x_in - self.model(x_in, t[0])) / sigma
        dims = x.dim()
        alpha_t, sigma_t = self.noise_schedule.marginal_alpha(t), self.noise_schedule.marginal_std(t)
        return (x - expand_dims(sigma_t, dims) * noise) / expand_dims(alpha_t, dims)

    def multistep_uni_pc_bh_update(self, x, model_prev_list, t_prev_list, t, order, use_corrector=True):
        ns = self.noise_schedule
        dims = x.dim()
        t_prev_0 = t_prev_list[-1]
        lambda_prev_0 = ns.marginal_lambda(t_prev_0)
        lambda_t = ns.marginal_lambda(t)
        model_prev_0 = model_prev_list[-1]
        sigma_prev_0, sigma_t = ns.marginal_std(t_prev_0), ns.marginal_std(t)
        log_alpha_t = ns.marginal_log_mean_coeff(t)
        alpha_t = torch.exp(log_alpha_t)
        h = lambda_t - lambda_prev_0
        rks = []
        D1s = []
        for i in range(1, order):
            t_prev_i = t_prev_list[-(i + 1)]
            model_prev_i = model_prev_list[-(i + 1)]
            lambda_prev_i = ns.marginal_lambda(t_prev_i)
            rk = ((lambda_prev_i - lambda_prev_0) / h)[0]
            rks.append(rk)
            D1s.append((model_prev_i - model_prev_0) / rk)
        rks.append(1.)
        rks = torch.tensor(rks, device=x.device)
        R = []
        b = []
        hh = -h[0]
        h_phi_1 = torch.expm1(hh)
        h_phi_k = h_phi_1 / hh - 1
        factorial_i = 1
        B_h = hh
        for i in range(1, order + 1):
            R.append(torch.pow(rks, i - 1))
            b.append(h_phi_k * factorial_i / B_h)
            factorial_i *= (i + 1)
            h_phi_k = h_phi_k / hh - 1 / factorial_i
        R = torch.stack(R)
        b = torch.tensor(b, device=x.device)
        use_predictor = len(D1s) > 0
        if len(D1s) > 0:
            D1s = torch.stack(D1s, dim=1)
            rhos_p = torch.tensor([0.5], device=b.device) if order == 2 else torch.linalg.solve(R[:-1, :-1], b[:-1])
        else:
            D1s = None
        if use_corrector:
            rhos_c = torch.tensor([0.5], device=b.device) if order == 1 else torch.linalg.solve(R, b)
        model_t = None
        x_t_ = expand_dims(sigma_t / sigma_prev_0, dims) * x - expand_dims(alpha_t * h_phi_1, dims) * model_prev_0
        pred_res = torch.einsum('k,bkchw->bchw', rhos_p, D1s) if use_predictor else 0
        x_t = x_t_ - expand_dims(alpha_t * B_h, dims) * pred_res
        if use_corrector:
            model_t = self.model_fn(x_t, t)
            corr_res = torch.einsum('k,bkchw->bchw', rhos_c[:-1], D1s) if D1s is not None else 0
            D1_t = (model_t - model_prev_0)
            x_t = x_t_ - expand_dims(alpha_t * B_h, dims) * (corr_res + rhos_c[-1] * D1_t)
        return x_t, model_t

    def sample(self, x, timesteps, order, lower_order_final=True):
        steps = len(timesteps) - 1
        for step_index in range(steps):
            if step_index == 0:
                vec_t = timesteps[0].expand(x.shape[0])
                model_prev_list = [self.model_fn(x, vec_t)]
                t_prev_list = [vec_t]
            elif step_index < order:
                init_order = step_index
                vec_t = timesteps[init_order].expand(x.shape[0])
                x, model_x = self.multistep_uni_pc_bh_update(x, model_prev_list, t_prev_list, vec_t, init_order, use_corrector=True)
                if model_x is None:
                    model_x = self.model_fn(x, vec_t)
                model_prev_list.append(model_x)
                t_prev_list.append(vec_t)
            else:
                extra_final_step = 1 if step_index == (steps - 1) else 0
                for step in range(step_index, step_index + 1 + extra_final_step):
                    vec_t = timesteps[step].expand(x.shape[0])
                    step_order = min(order, steps + 1 - step) if lower_order_final else order
                    use_corrector = step != steps
                    x, model_x = self.multistep_uni_pc_bh_update(x, model_prev_list, t_prev_list, vec_t, step_order, use_corrector=use_corrector)
                    for i in range(order - 1):
                        t_prev_list[i] = t_prev_list[i + 1]
                        model_prev_list[i] = model_prev_list[i + 1]
                    t_prev_list[-1] = vec_t
                    if step < steps:
                        if model_x is None:
                            model_x = self.model_fn(x, vec_t)
                        model_prev_list[-1] = model_x
        return x


def sample_unipc(model, noise, sigmas, ms, noise_sampler):
    timesteps = sigmas.clone()
    if sigmas[-1] < 0.001:
        timesteps[-1] = 0.001
    ns = SigmaConvert()
    noise = noise / torch.sqrt(1.0 + timesteps[0] ** 2.0)
    order = min(3, len(timesteps) - 2)
    x = UniPC(model, ns).sample(noise, timesteps=timesteps, order=order)
    x /= ns.marginal_alpha(timesteps[-1])
    return x


REFERENCE = {
    "euler": sample_euler, "euler_ancestral": sample_euler_ancestral, "heun": sample_heun,
    "dpmpp_2m": sample_dpmpp_2m, "dpmpp_2m_sde": sample_dpmpp_2m_sde,
    "dpmpp_sde": sample_dpmpp_sde, "res_multistep": sample_res_multistep,
    "uni_pc": sample_unipc, "lcm": sample_lcm,
}


def default_noise_sampler(x, seed):
    """ComfyUI's default_noise_sampler for a CPU x (its seed + 1)."""
    generator = torch.Generator(device=x.device)
    generator.manual_seed(seed + 1)
    return lambda sigma, sigma_next: torch.randn(x.size(), dtype=x.dtype, layout=x.layout, device=x.device, generator=generator)


class BatchedBrownianTree:
    """A wrapper around torchsde.BrownianTree that enables batches of entropy."""

    def __init__(self, x, t0, t1, seed=None, **kwargs):
        import torchsde

        self.cpu_tree = kwargs.pop("cpu", True)
        t0, t1, self.sign = self.sort(t0, t1)
        w0 = kwargs.pop('w0', None)
        if w0 is None:
            w0 = torch.zeros_like(x)
        self.batched = False
        if seed is None:
            seed = (torch.randint(0, 2 ** 63 - 1, ()).item(),)
        elif isinstance(seed, (tuple, list)):
            if len(seed) != x.shape[0]:
                raise ValueError("Passing a list or tuple of seeds to BatchedBrownianTree requires a length matching the batch size.")
            self.batched = True
            w0 = w0[0]
        else:
            seed = (seed,)
        if self.cpu_tree:
            t0, w0, t1 = t0.detach().cpu(), w0.detach().cpu(), t1.detach().cpu()
        self.trees = tuple(torchsde.BrownianTree(t0, w0, t1, entropy=s, **kwargs) for s in seed)

    @staticmethod
    def sort(a, b):
        return (a, b, 1) if a < b else (b, a, -1)

    def __call__(self, t0, t1):
        t0, t1, sign = self.sort(t0, t1)
        device, dtype = t0.device, t0.dtype
        if self.cpu_tree:
            t0, t1 = t0.detach().cpu().float(), t1.detach().cpu().float()
        w = torch.stack([tree(t0, t1) for tree in self.trees]).to(device=device, dtype=dtype) * (self.sign * sign)
        return w if self.batched else w[0]


class BrownianTreeNoiseSampler:
    """A noise sampler backed by a torchsde.BrownianTree (ComfyUI's)."""

    def __init__(self, x, sigma_min, sigma_max, seed=None, transform=lambda x: x, cpu=False):
        self.transform = transform
        t0, t1 = self.transform(torch.as_tensor(sigma_min)), self.transform(torch.as_tensor(sigma_max))
        self.tree = BatchedBrownianTree(x, t0, t1, seed, cpu=cpu)

    def __call__(self, sigma, sigma_next):
        t0, t1 = self.transform(torch.as_tensor(sigma)), self.transform(torch.as_tensor(sigma_next))
        return self.tree(t0, t1) / (t1 - t0).abs().sqrt()


def noise_sampler_for(name, x, sigmas, seed):
    """The noise each sampler builds when given none: its `extra_args["seed"]` is the noise seed;
    dpmpp_sde and dpmpp_2m_sde draw from a Brownian tree over the schedule's σ range."""
    if name in ("dpmpp_sde", "dpmpp_2m_sde"):
        sigma_min, sigma_max = sigmas[sigmas > 0].min(), sigmas.max()
        return BrownianTreeNoiseSampler(x, sigma_min, sigma_max, seed=seed, cpu=True)
    return default_noise_sampler(x, seed)
