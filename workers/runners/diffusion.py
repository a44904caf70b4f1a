"""Runners of the generic diffusion nodes: loaders, encode, latent, sample, VAE — for every
registered model family (workers/models/families.py).

Each loader asks the registry which family recognises its file (from the file's own keys, never
its name) and loads it with that family's plug-in; every value it returns names its `family`,
and the nodes downstream call that family's plug-in (schedule, denoiser, encode, decode). No
family is named here. Values between nodes (workers/models/values.py):
    model → DiffusionModel    vae → Vae    text-encoder → TextEncoder
    conditioning → Conditioning (the family's embeds)    latent → Latent ([1, C, H/d, W/d] float32)
    image → PIL.Image.Image (RGB)
Seeds draw from `torch.Generator("cpu").manual_seed(seed)`, so a seed gives the same image on
any device profile (up to the device's float rounding). Every loader notes the file's sha256 in
the lineage (`models: {"<folder>/<name>": sha256}`); samplers note the seed.
Torch and diffusers are imported inside the functions: importing this module is cheap.
Every torch computation runs on the worker's device thread (workers/device/thread.py); the
runners themselves run on the slots' threads. Family nodes (e.g. `zimage/turbo`) live in their
family's package and call the helpers below.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from workers.device.thread import on_device_thread
from workers.models.catalog import ModelFileMissing, resolve
from workers.models.families import info, loader_family, plugin
from workers.models.family import ModelLoadError
from workers.models.values import Conditioning, DiffusionModel, Latent, TextEncoder, Vae
from workers.runners.base import NodeContext, NodeFailed, runner

EMPTY_GRID, EMPTY_DOWNSCALE = 16, 8  # latent/empty's pixel grid and the size it keeps


@runner("load/diffusion-model")
def load_diffusion_model(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    return {"model": load_file(ctx, "diffusion_models", params["file"])}


@runner("load/vae")
def load_vae(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    return {"vae": load_file(ctx, "vae", params["file"])}


@runner("load/checkpoint")
def load_checkpoint(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    """An all-in-one file (SDXL's): its family's plug-in loads the denoiser, the text
    encoder(s) and the VAE."""
    model, encoder, vae = load_file(ctx, "checkpoints", params["file"])
    return {"model": model, "encoder": encoder, "vae": vae}


@runner("load/text-encoder")
def load_text_encoder(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    """`family` names the family whose encoder this is where several read the same file (a
    Qwen3: Z-Image's or FLUX.2 Klein's); "auto": the first registered one that recognises it."""
    names = [params["file"], *([params["file_2"]] if params.get("file_2") else [])]
    family = str(params.get("family") or "auto")
    return {"encoder": load_file(ctx, "text_encoders", *names,
                                 family=None if family == "auto" else family)}


@runner("load/lora")
def load_lora(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    """The model it gets with one more LoRA (`loras/<lora>` at `strength`), chainable; with a
    text encoder wired, that encoder with the file's text-encoder half at `strength_clip`
    (ComfyUI's LoraLoader). No base weight is touched: each half is applied per batch row at
    each forward / encode (workers/models/lora.py), so runs with other LoRAs, or none, share
    the same forwards and encodes."""

    from workers.models.lora import AppliedLora

    model = expect(inputs, "model", DiffusionModel)
    encoder = None if inputs.get("encoder") is None else expect(inputs, "encoder", TextEncoder)
    strength = float(params.get("strength", 1.0))
    strength_clip = float(params.get("strength_clip", 1.0))
    weights, encoder_weights = _lora_halves(ctx, str(params["lora"]), model, encoder,
                                            strength_clip)
    if weights.modules:  # else a file with a text-encoder half only
        model = replace(model, loras=(*model.loras, AppliedLora(weights, strength)))
        ctx.note_lineage(loras=_lora_lineage(model.loras))
    if encoder is None:
        return {"model": model}
    if encoder_weights is not None and encoder_weights.modules:
        encoder = replace(encoder, loras=(*encoder.loras,
                                          AppliedLora(encoder_weights, strength_clip)))
        # its own key: a later node without the encoder wired keeps it upstream
        ctx.note_lineage(textEncoderLoras=_lora_lineage(encoder.loras))
    return {"model": model, "encoder": encoder}


def _lora_halves(ctx: NodeContext, name: str, model: DiffusionModel, encoder: TextEncoder | None,
                 strength_clip: float) -> tuple[Any, Any]:
    """(the denoiser's LoraWeights, the text encoder's or None) of `loras/<name>`, read (on the
    device thread: hooks are installed between forwards) and cached by content; a NodeFailed
    naming the file when it does not fit or holds nothing for them."""
    from workers.models.catalog import file_sha256
    from workers.models.lora import LoraMismatch, lora_for

    family = plugin(model.family)
    if not hasattr(family, "lora_state_dict"):
        raise NodeFailed(f"{model.family} models take no LoRAs yet")
    try:
        path = resolve(ctx.models_dir, "loras", name)
    except ModelFileMissing as exc:
        raise NodeFailed(str(exc)) from exc
    sha = file_sha256(path)
    try:
        weights = on_device_thread(lambda: lora_for(family, path, sha, model.transformer))
        encoder_weights = None
        if encoder is not None:
            _same_family(model, encoder, "encoder")
            encoder_weights = _encoder_lora(family, path, sha, model, encoder, strength_clip)
    except LoraMismatch as exc:
        raise NodeFailed(f"{exc} ({model.name} is a {model.family} model)") from exc
    if not weights.modules and not (encoder_weights and encoder_weights.modules):
        raise NodeFailed(f"loras/{name} has no LoRA weights for {model.name} "
                         f"({model.family}){'' if encoder else ' (nor is a text encoder wired)'}")
    return weights, encoder_weights


def _lora_lineage(loras: tuple[Any, ...]) -> dict[str, dict[str, Any]]:
    """{"loras/<name>": {sha256, strength}} of a chain of AppliedLoras (the whole chain: each
    load/lora node notes what its value carries)."""
    return {f"loras/{a.weights.name}": {"sha256": a.weights.sha256, "strength": a.strength}
            for a in loras}


def _encoder_lora(family: Any, path: Any, sha: str, model: DiffusionModel, encoder: TextEncoder,
                  strength_clip: float) -> Any:
    """The text-encoder half of `path` for `encoder` (LoraWeights, possibly without modules),
    None at strength_clip 0. A family that reads no text-encoder LoRAs passes the encoder on
    unchanged when the file has no such half, and refuses one that has (LoraMismatch)."""
    from workers.models.lora import LoraMismatch, encoder_lora_for, text_encoder_keys

    if strength_clip == 0:
        return None
    if not hasattr(family, "text_encoder_lora_state_dict"):
        keys = text_encoder_keys(path)
        if keys:
            raise LoraMismatch(f"loras/{path.name} has text-encoder weights ({keys[0]}, …), which "
                               f"{model.family} text encoders do not take yet: set strength_clip "
                               "to 0 (the model half still applies)")
        return None
    return on_device_thread(lambda: encoder_lora_for(family, path, sha, encoder,
                                                     model.transformer))


@runner("encode/text")
def encode_text(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    encoder = expect(inputs, "encoder", TextEncoder)
    text = str(inputs.get("text", params.get("text", "")))
    return {"conditioning": Conditioning(encode(encoder, text), text, encoder)}


@runner("latent/empty")
def latent_empty(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    """Only a size: the sampler makes zeros in its own family's latent format."""
    import torch

    width, height = int(params["width"]), int(params["height"])
    if width % EMPTY_GRID or height % EMPTY_GRID or width <= 0 or height <= 0:
        raise NodeFailed(f"image sides must be positive multiples of {EMPTY_GRID}, "
                         f"got {width}×{height}")
    size = (1, 0, height // EMPTY_DOWNSCALE, width // EMPTY_DOWNSCALE)
    return {"latent": Latent(torch.zeros(size), empty=True, downscale=EMPTY_DOWNSCALE)}


@runner("model/differential-diffusion")
def differential_diffusion(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    """The model with DifferentialDiffusion's strength: samplers threshold a noise mask by the
    run's progress (workers/sampling/inpaint.py)."""
    model = expect(inputs, "model", DiffusionModel)
    return {"model": replace(model, differential=float(params["strength"]))}


@runner("sample/advanced")
def sample_advanced(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    """`sample` with KSamplerAdvanced's window params (see `sample`)."""
    return sample(ctx, params, inputs)


@runner("sample")
def sample(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    """Denoise `latent` (pure noise at denoise 1.0; else re-noised to the schedule's start).

    `sample/advanced` adds ComfyUI's KSamplerAdvanced controls: only steps [start_step,
    end_step) of the `steps` schedule run; without `add_noise` the latent is taken as already
    noised to the window's first sigma (a previous window's result); with
    `return_with_leftover_noise` a window that ends early returns its latent still noised, else
    its last step goes to σ 0. So two samplers chain (Wan 2.2's high-noise then low-noise
    expert). Flow latents between windows are in ComfyUI's scaling (x / (1 − σ)), so either
    half may be a custom sampler."""
    import torch

    model = expect(inputs, "model", DiffusionModel)
    positive = expect(inputs, "positive", Conditioning)
    latent = expect(inputs, "latent", Latent)
    negative = inputs.get("negative")
    seed, steps = int(inputs.get("seed", params["seed"])), int(params["steps"])
    guidance, denoise = float(params["guidance"]), float(params["denoise"])
    window = _Window.of(params)
    family, fmt = plugin(model.family), latent_format(model)
    _same_family(model, positive.encoder, "positive")
    extra: dict[str, Any] = dict(positive.extra)
    if distilled(model):  # an embedded scale: no CFG, one forward
        extra, guidance = {**extra, "guidance": guidance}, 0.0
    width, height = latent.pixel_size
    shape = latent_shape(model, latent)
    shift = None if params.get("shift") is None else float(params["shift"])
    sampler = params.get("sampler", "default")
    comfy_mask = latent.mask is not None and not getattr(family, "keeps_masked", False)
    if (sampler, params.get("scheduler", "default")) != ("default", "default") or comfy_mask:
        # the generic samplers (a noise mask: ComfyUI's, the family's sigmas under euler)
        from workers.models.values import Sigmas

        values = window.sigmas(_ksampler_sigmas(params, model, latent).values)
        if values is None:
            return {"latent": latent}
        out, _ = sample_with(ctx, model, positive, _negative_embeds(positive, negative, guidance),
                             guidance, extra, latent, Sigmas(values=values), sampler, seed,
                             add_noise=window.add_noise, shift=shift)
        return {"latent": out}
    extra = {**extra, **_masked(model, latent)}
    sigmas, timesteps = checked(lambda: family.schedule(steps, width, height, denoise,
                                                        shift=shift))
    cut = window.cut(sigmas, timesteps)
    if cut is None:  # ComfyUI: a window past the last step returns the latent as it came
        return {"latent": latent}
    sigmas, timesteps = cut
    device = model.placement.device

    def start_latents() -> Any:
        generator = torch.Generator("cpu").manual_seed(seed)
        eps = noise(shape, generator, device)
        if denoise >= 1.0 and window.plain:
            init_noise = getattr(family, "init_noise", None)  # optional: flow starts at eps
            return eps if init_noise is None else init_noise(eps, sigmas)
        init = torch.zeros(shape) if latent.empty else latent.samples
        return family.renoise(init.to(device), eps if window.add_noise else eps * 0, sigmas[0])

    start = on_device_thread(start_latents)
    neg = _negative_embeds(positive, negative, guidance)
    ctx.note_lineage(seed=seed)
    out = denoise_job(ctx, model, start, sigmas, timesteps, positive.embeds, neg, guidance,
                      extra=extra)
    if float(sigmas[-1]) > 0 and _const(family, width, height, shift):  # leftover noise
        out = out / (1.0 - sigmas[-1].to(out.device))
    return {"latent": _kept(latent, out, fmt.downscale)}


class _Window:
    """The `sample` node's KSamplerAdvanced params: steps [first, last), add_noise,
    return_with_leftover_noise (ComfyUI's `common_ksampler` semantics)."""

    def __init__(self, first: int, last: int, add_noise: bool, leftover: bool) -> None:
        self.first, self.last, self.add_noise, self.leftover = first, last, add_noise, leftover

    @classmethod
    def of(cls, params: dict[str, Any]) -> _Window:
        return cls(int(params.get("start_step", 0)), int(params.get("end_step", MAX_END_STEP)),
                   bool(params.get("add_noise", True)),
                   bool(params.get("return_with_leftover_noise", False)))

    @property
    def plain(self) -> bool:
        """Every step, from fresh noise: the sampler's ordinary run."""
        return self.first == 0 and self.add_noise

    def sigmas(self, values: Any) -> Any:
        """`values` [n + 1] cut to the window; None when it starts past the last step."""
        cut = self.cut(values, values[:-1])
        return None if cut is None else cut[0]

    def cut(self, sigmas: Any, timesteps: Any) -> tuple[Any, Any] | None:
        if self.last < len(sigmas) - 1:
            sigmas, timesteps = sigmas[: self.last + 1].clone(), timesteps[: self.last]
            if not self.leftover:
                sigmas[-1] = 0.0
        if self.first > 0:
            if self.first >= len(sigmas) - 1:
                return None
            sigmas, timesteps = sigmas[self.first:], timesteps[self.first:]
        return sigmas, timesteps


MAX_END_STEP = 10000  # ComfyUI's KSamplerAdvanced end_step default: past any schedule


def _const(family: Any, width: int, height: int, shift: float | None) -> bool:
    """Whether the family's sampling is flow matching (ComfyUI's CONST: its latents between
    sampler windows are scaled by 1 / (1 − σ))."""
    sampling = getattr(family, "model_sampling", None)
    return bool(sampling and sampling(width, height, shift=shift).const)


def latent_format(model: DiffusionModel) -> Any:
    """`model`'s latents (a LatentFormat): its family's, unless the family's plug-in tells per
    model (`latent_format(model)`: Wan's TI2V-5B samples the Wan 2.2 VAE's 48 channels at ÷16)."""
    own = getattr(plugin(model.family), "latent_format", None)
    return info(model.family).latent if own is None else own(model)


def _masked(model: DiffusionModel, latent: Latent) -> dict[str, Any]:
    """The job's `extra` for a masked latent (`keep`: the given samples and the mask; the
    family's predict holds the masked-out part at the samples); a NodeFailed when `model`'s
    family does not sample one."""
    if latent.mask is None:
        return {}
    if not getattr(plugin(model.family), "keeps_masked", False):
        raise NodeFailed(f"the latent keeps part of itself (a noise mask); {model.name} "
                         f"({model.family}) cannot sample such a latent")
    return {"keep": (latent.samples, latent.mask)}


def _kept(latent: Latent, out: Any, downscale: int) -> Latent:
    """The sampler's result `out` as a Latent, with a masked latent's kept part put back (the
    pipelines' last `(1 − mask)·condition + mask·latents`); the mask rides on."""
    if latent.mask is None:
        return Latent(out, downscale=downscale)
    mask, kept = latent.mask.to(out.device), latent.samples.to(out.device, out.dtype)
    return Latent((1 - mask) * kept + mask * out, downscale=downscale, mask=latent.mask)


def latent_shape(model: DiffusionModel, latent: Latent) -> tuple[int, ...]:
    """The shape `model`'s family samples for `latent`: [1, C, h, w] for an image, [1, C, F',
    h, w] for a video latent (latent/empty-video, a decoded clip's); a NodeFailed when a given
    latent is not that shape."""
    fmt = latent_format(model)
    width, height = latent.pixel_size
    shape: tuple[int, ...] = checked(lambda: fmt.shape(width, height))
    if latent.samples.ndim == 5:
        shape = (*shape[:2], int(latent.samples.shape[2]), *shape[2:])
    if not latent.empty and tuple(latent.samples.shape) != shape:
        raise NodeFailed(
            f"the latent has shape {tuple(latent.samples.shape)}; {model.name} "
            f"({model.family}) expects {shape} at {width}×{height}"
        )
    return shape


def sample_with(ctx: NodeContext, model: DiffusionModel, positive: Conditioning, negative: Any,
                guidance: float, extra: dict[str, Any], latent: Latent, sigmas: Any,
                sampler: str, seed: int, add_noise: bool = True,
                shift: float | None = None) -> tuple[Latent, Latent]:
    """Denoise `latent` with generic sampler `sampler` ("default": euler) over `sigmas` (a
    `Sigmas` value), as ComfyUI's KSampler / SamplerCustom(Advanced) do: the start is the
    model sampling's noise scaling of `seed`'s noise (zeros without `add_noise`) at σ₀; the
    sampler's own noise (ancestral, SDE) is drawn from `seed` too; it steps on the family's
    `to_denoised`; `shift`: the family's sigma shift (None: its default). Returns (the result,
    the last x0 estimate)."""
    import torch

    from workers.sampling.inpaint import NoiseMask
    from workers.sampling.samplers import Stepper, eval_timesteps, plan

    family, fmt = plugin(model.family), latent_format(model)
    _same_family(model, positive.encoder, "positive")
    # a family that keeps a masked latent in its own way (Wan) gets `keep`; others ComfyUI's
    comfy_mask = None if getattr(family, "keeps_masked", False) else latent.mask
    if comfy_mask is None:
        extra = {**extra, **_masked(model, latent)}
    width, height = latent.pixel_size
    shape = latent_shape(model, latent)
    if not (hasattr(family, "to_denoised") and hasattr(family, "model_sampling")):
        if comfy_mask is not None:
            raise NodeFailed(f"the latent keeps part of itself (a noise mask); {model.name} "
                             f"({model.family}) cannot sample such a latent")
        raise NodeFailed(f"{model.family} models have no generic samplers yet: use sampler "
                         "\"default\"")
    ms = family.model_sampling(width, height, shift=shift)
    values = sigmas.values
    if values is None:
        from workers.sampling.schedulers import sigmas_for

        values = checked(lambda: sigmas_for(ms, sigmas.scheduler, sigmas.steps, sigmas.denoise))
    values = values.float().cpu()
    if len(values) == 0:
        raise NodeFailed("the sigmas are empty")
    name = "euler" if sampler == "default" else sampler
    init = torch.zeros(shape) if latent.empty else latent.samples.float().cpu()
    eps = (noise(shape, torch.Generator("cpu").manual_seed(seed), "cpu") if add_noise
           else torch.zeros(shape))
    inpaint = None
    if comfy_mask is not None:
        inpaint = NoiseMask(init, comfy_mask.float().cpu(), eps, ms, values, model.differential)
    stepper = Stepper(name, values, ms, seed, family.to_denoised, inpaint=inpaint)

    def start() -> Any:
        max_denoise = math.isclose(ms.sigma_max, float(values[0]), rel_tol=1e-05) or (
            float(values[0]) > ms.sigma_max)
        return ms.noise_scaling(values[0], eps, init, max_denoise).to(model.placement.device)

    x = on_device_thread(start)
    ctx.note_lineage(seed=seed)
    if len(values) > 1:  # one sigma: no step, the noised latent comes back (as ComfyUI's)
        steps = checked(lambda: plan(name, values, ms))
        x = denoise_job(ctx, model, on_device_thread(stepper.start, x), steps.sigmas,
                        eval_timesteps(steps.sigmas, ms), positive.embeds, negative, guidance,
                        extra=extra, advance=stepper.advance, step_done=steps.step_done)
    if ms.const and values[-1] < 1:  # CONST.inverse_noise_scaling (σ 1 would divide by 0)
        x = x / (1.0 - values[-1].to(x.device))
    denoised = stepper.denoised if stepper.denoised is not None else x
    if comfy_mask is not None:  # the stepper kept the rest (ComfyUI's KSampler: no blend after the last step)
        return (Latent(x, downscale=fmt.downscale, mask=latent.mask),
                Latent(denoised, downscale=fmt.downscale, mask=latent.mask))
    return _kept(latent, x, fmt.downscale), _kept(latent, denoised, fmt.downscale)


def _ksampler_sigmas(params: dict[str, Any], model: DiffusionModel, latent: Latent) -> Any:
    """The `sample` node's sigmas for a named scheduler (else the family's own schedule), with
    the node's meaning of `steps` and `denoise` (the family's img2img: the last
    steps·denoise of a `steps` schedule; the importer maps ComfyUI's KSampler denoise to it)."""
    from workers.models.values import Sigmas
    from workers.sampling.schedulers import sigmas_for

    steps, denoise = int(params["steps"]), float(params["denoise"])
    scheduler = params.get("scheduler", "default")
    shift = None if params.get("shift") is None else float(params["shift"])
    width, height = latent.pixel_size
    family = plugin(model.family)
    if scheduler == "default":
        own = checked(lambda: family.schedule(steps, width, height, denoise, shift=shift))
        return Sigmas(values=own[0])
    if not hasattr(family, "model_sampling"):
        raise NodeFailed(f"{model.family} models have no generic schedulers yet: use scheduler "
                         "\"default\"")
    skip = int(max(steps - min(steps * denoise, steps), 0))
    if steps - skip < 1:
        raise NodeFailed(f"denoise {denoise} of {steps} steps leaves no step to run; raise "
                         "denoise or steps")
    ms = family.model_sampling(width, height, shift=shift)
    return Sigmas(values=checked(lambda: sigmas_for(ms, scheduler, steps))[skip:])


@runner("vae/decode")
def vae_decode(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    vae, latent = expect(inputs, "vae", Vae), expect(inputs, "latent", Latent)
    if latent.empty:
        raise NodeFailed("an empty latent holds no image: sample it first")
    return {"image": decode(vae, latent.samples)}


@runner("vae/encode")
def vae_encode(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    """Encode an RGB image to its VAE posterior's mode (deterministic: no seed here)."""
    vae, image = expect(inputs, "vae", Vae), rgb(inputs)
    family, fmt = plugin(vae.family), info(vae.family).latent
    samples = checked(lambda: on_device_thread(family.encode_image, vae, image))
    return {"latent": Latent(samples, downscale=fmt.downscale)}


@runner("vae/decode-tiled")
def vae_decode_tiled(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    """vae/decode in tiles, the same image within float rounding (workers/models/tiled_vae.py)."""
    vae, latent = expect(inputs, "vae", Vae), expect(inputs, "latent", Latent)
    if latent.empty:
        raise NodeFailed("an empty latent holds no image: sample it first")
    family, tiled = plugin(vae.family), _tiled_vae(vae, params)
    images = checked(lambda: on_device_thread(family.decode_latents_batch, tiled,
                                              [latent.samples]))
    return {"image": images[0]}


@runner("vae/encode-tiled")
def vae_encode_tiled(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    """vae/encode in tiles, the same latent within float rounding."""
    vae, image = expect(inputs, "vae", Vae), rgb(inputs)
    family, fmt = plugin(vae.family), info(vae.family).latent
    tiled = _tiled_vae(vae, params)
    samples = checked(lambda: on_device_thread(family.encode_image, tiled, image))
    return {"latent": Latent(samples, downscale=fmt.downscale)}


def _tiled_vae(vae: Vae, params: dict[str, Any]) -> Vae:
    """`vae` whose module decodes and encodes in tiles (a node error for a VAE it cannot tile)."""
    from dataclasses import replace

    from workers.models.tiled_vae import NotTileable, TiledAutoencoder

    try:
        module = TiledAutoencoder(vae.module, int(params.get("tile_size", 512)),
                                  int(params.get("overlap", 64)))
    except NotTileable as exc:
        raise NodeFailed(f"{vae.name} ({vae.family}) cannot be tiled: {exc}; use vae/decode or "
                         "vae/encode") from None
    return replace(vae, module=module, batched=None)


def noise(shape: tuple[int, ...], generator: Any, device: str) -> Any:
    """Gaussian noise drawn from `generator` (a CPU generator: seeds are portable), float32."""
    import torch
    from diffusers.utils.torch_utils import randn_tensor

    return randn_tensor(shape, generator=generator, device=torch.device(device), dtype=torch.float32)


def distilled(model: DiffusionModel) -> bool:
    """Whether `model`'s guidance is an embedded scale (one forward per step) rather than CFG:
    its family's `guidance`, unless the family's plug-in tells per model (`distilled(model)`:
    FLUX.2 dev embeds it, Klein guides)."""
    per_model = getattr(plugin(model.family), "distilled", None)
    return bool(per_model(model)) if per_model else info(model.family).guidance == "distilled"


def _same_family(model: DiffusionModel, encoder: TextEncoder, port: str) -> None:
    if encoder.family != model.family:
        raise NodeFailed(
            f"input {port!r} was encoded by {encoder.name} ({encoder.family}); {model.name} is "
            f"a {model.family} model: use its family's text encoder"
        )


def denoise_job(
    ctx: NodeContext,
    model: DiffusionModel,
    start: Any,
    sigmas: Any,
    timesteps: Any,
    positive: Any,
    negative: Any,
    guidance: float,
    preview: Vae | None = None,
    extra: dict[str, Any] | None = None,
    frames: int | None = None,
    **job_fields: Any,
) -> Any:
    """Submit one SampleJob to the model's step batcher; returns latents [1, C, h, w].

    With `preview` (the VAE that will decode the result), progress carries a small preview of
    the current estimate at most every INLINE_PREVIEW_SECONDS (0: every step). `frames`: the
    clip's, for its progress events (else the family's `video_frames`). `job_fields`:
    more SampleJob fields (a generic sampler's `advance` and `step_done`).
    """
    import torch

    from workers.sampling import SampleJob

    device = model.placement.device
    job = SampleJob(
        latents=start.to(device),
        sigmas=sigmas.to(device),
        timesteps=timesteps.to(device),
        positive=positive.to(device),
        guidance=guidance,
        negative=None if negative is None else negative.to(device),
        check_cancelled=ctx.check_cancelled,
        extra=extra or {},
        loras=model.loras,
        # the family's own step (optional: else flow Euler) unless a generic sampler's is given
        **{"advance": getattr(plugin(model.family), "advance", None), **job_fields},
    )
    job.on_progress = _progress_reporter(ctx, job, preview, frames or _clip_frames(model, start),
                                         getattr(plugin(model.family), "preview_pixels", None))
    from workers.parallel.worker import denoiser

    group = denoiser()  # a group worker (xfuser.<n>): its ranks split the denoise
    if group is not None and model.loras:
        raise NodeFailed(f"LoRAs do not run on a GPU group yet: run {model.name} with parallel "
                         "\"off\"")
    if group is not None and not info(model.family).splits:
        raise NodeFailed(f"{model.name} is a {model.family} model, which cannot be split across "
                         "GPUs: run it with parallel \"off\"")
    try:
        return model.batcher.run(job) if group is None else group.run(ctx, model, job)
    except torch.OutOfMemoryError as exc:
        raise NodeFailed(f"out of device memory while sampling with {model.name}: {exc}") from exc
    except ValueError as exc:  # the family's predict refusing the job (Wan: I2V channels)
        raise NodeFailed(f"{model.name}: {exc}") from exc


def _clip_frames(model: DiffusionModel, start: Any) -> int | None:
    """The frames of the clip video latents [1, C, F', h, w] decode to (the family's
    `video_frames`), None for an image's [1, C, h, w]."""
    frames = getattr(plugin(model.family), "video_frames", None)
    if start.ndim != 5 or frames is None:
        return None
    return int(frames(int(start.shape[2])))


def _progress_reporter(ctx: NodeContext, job: Any, vae: Vae | None, frames: int | None = None,
                       own: Callable[[Any], Any] | None = None) -> Callable[[int, int], None]:
    """`on_progress` for a job: reports every step (with the clip's `frames` for a video), with
    a preview when one is due: from `vae`, else the family's own `preview_pixels(job)` (LTX-2:
    its sampler's job holds what it needs)."""
    import time

    interval = _preview_seconds()
    last = [float("-inf")]

    def report(done: int, total: int) -> None:
        png = None
        now = time.monotonic()
        if ((vae is not None or own is not None) and interval is not None and done < total
                and now - last[0] >= interval):
            from workers.models.preview import preview_pixels, preview_png

            # The device thread computes the pixels; the PNG is encoded here, on the slot's
            # thread, so no other slot's next step waits behind it.
            if vae is not None:
                pixels = on_device_thread(preview_pixels, vae, job.latents, job.sigmas[job.step],
                                          job.velocity)
            else:
                pixels = on_device_thread(own, job) if own is not None else None
            png = None if pixels is None else preview_png(pixels)
            last[0] = now
        ctx.progress(done, total, png, batch=job.batch, frames=frames)

    return report


def _preview_seconds() -> float | None:
    """INLINE_PREVIEW_SECONDS from the settings (None: previews off); 1.0 outside Django."""
    from django.conf import settings

    if not settings.configured:
        return 1.0
    seconds = float(settings.INLINE_PREVIEW_SECONDS)
    return None if seconds < 0 else seconds


def _negative_embeds(positive: Conditioning, negative: Any, guidance: float) -> Any:
    """The negative embeds for CFG: the wired conditioning, else the empty prompt's."""
    if guidance <= 0:
        return None
    if negative is None:
        return encode(positive.encoder, "")
    if not isinstance(negative, Conditioning):
        raise NodeFailed(f"input 'negative' must be conditioning, got {type(negative).__name__}")
    return negative.embeds


def encode(encoder: TextEncoder, text: str) -> Any:
    """The conditioning of `text` in the encoder's family's form (with the encoder's LoRAs), in
    one encoder call with other slots' texts that are waiting at the same moment (the worker's
    batched encoder); alone, the pipeline's call."""
    if encoder.batched is None:
        from workers.models.lora import encode_rows

        encode_prompts = plugin(encoder.family).encode_prompts
        return on_device_thread(
            lambda: encode_rows(encode_prompts, encoder, [(text, encoder.loras)])[0])
    return encoder.batched.call((text, encoder.loras))


def decode(vae: Vae, latents: Any) -> Any:
    """The image of latents [1, C, h, w], decoded together with same-size latents of other
    slots waiting at the same moment; alone, the pipeline's decode."""
    if vae.batched is None:
        decode_batch = plugin(vae.family).decode_latents_batch
        return on_device_thread(lambda: decode_batch(vae, [latents])[0])
    return vae.batched.call(latents)


_LOADERS = {"diffusion_models": "load_diffusion_model", "vae": "load_vae",
            "text_encoders": "load_text_encoder", "checkpoints": "load_checkpoint"}


def load_file(ctx: NodeContext, folder: str, *names: str, family: str | None = None) -> Any:
    """Load model `folder/name` (text encoders: a family's one or two files) with the plug-in of
    `family` (None: the first family that recognises every file) through the per-process cache;
    note its sha256 in the lineage.

    On a CPU worker the load runs on the device thread (copying weights runs torch's parallel
    kernels); on a GPU it stays on the slot, so a load never stalls the other slots' sampling."""

    def load() -> Any:
        paths = [resolve(ctx.models_dir, folder, name) for name in names]
        owner = loader_family(paths, folder, among=(family,) if family else None)
        loader = getattr(plugin(owner), _LOADERS[folder], None)
        if loader is None:  # an optional function (load_checkpoint)
            raise ModelLoadError(f"{' + '.join(names)}: the {owner} family has no loader for "
                                 f"{folder}/ files")
        # A family's text encoder may be several files (FLUX.1: CLIP-L + T5).
        arg = list(names) if folder == "text_encoders" else names[0]
        return loader(ctx.models_dir, arg, ctx.policy)

    return loaded(ctx, load, f"{folder}/{' + '.join(names)}")


def loaded(ctx: NodeContext, load: Callable[[], Any], files: str) -> Any:
    """`load()`'s value (a model, or a checkpoint's (model, encoder, vae)), run where loads run
    (load_file), its first model's sha256 noted in the lineage under `files`; a missing or
    unloadable file fails the node with the loader's message."""
    try:
        value = on_device_thread(load) if ctx.policy.device == "cpu" else load()
    except (ModelFileMissing, ModelLoadError) as exc:
        raise NodeFailed(str(exc)) from exc
    first = value[0] if isinstance(value, tuple) else value
    ctx.note_lineage(models={**ctx.lineage.get("models", {}), files: first.sha256})
    return value


def expect(inputs: dict[str, Any], port: str, kind: type) -> Any:
    value = inputs.get(port)
    if not isinstance(value, kind):
        got = "nothing" if value is None else type(value).__name__
        raise NodeFailed(f"input {port!r} must be a {kind.__name__}, got {got}")
    return value


def rgb(inputs: dict[str, Any]) -> Any:
    from PIL import Image

    image = expect(inputs, "image", Image.Image)
    if image.mode != "RGB":
        raise NodeFailed(f"input 'image' must be an RGB image, got mode {image.mode}")
    return image


def checked(compute: Callable[[], Any]) -> Any:
    """Run `compute`; a ValueError (bad size, no step left to run) becomes a NodeFailed."""
    try:
        return compute()
    except ValueError as exc:
        raise NodeFailed(str(exc)) from exc
