"""Runners of the diffusion nodes (Z-Image family): loaders, encode, latent, sample, VAE, and
the one-node `zimage/turbo`.

Values between nodes (see workers/models/zimage/values.py):
    model → DiffusionModel    vae → Vae    text-encoder → TextEncoder
    conditioning → Conditioning (embeds [L, D])    latent → Latent ([1, 16, H/8, W/8] float32)
    image → PIL.Image.Image (RGB)
Seeds draw from `torch.Generator("cpu").manual_seed(seed)`, so a seed gives the same image on
any device profile (up to the device's float rounding). Every loader notes the file's sha256 in
the lineage (`models: {"<folder>/<name>": sha256}`); samplers note the seed.
Torch and diffusers are imported inside the functions: importing this module is cheap.
Every torch computation runs on the worker's device thread (workers/device/thread.py); the
runners themselves run on the slots' threads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from workers.device.thread import on_device_thread
from workers.models.catalog import ModelFileMissing
from workers.models.zimage.values import Conditioning, DiffusionModel, Latent, TextEncoder, Vae
from workers.runners.base import NodeContext, NodeFailed, runner


@runner("load/diffusion-model")
def load_diffusion_model(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    from workers.models.zimage import loading

    return {"model": _load(ctx, loading.load_diffusion_model, "diffusion_models", params["file"])}


@runner("load/vae")
def load_vae(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    from workers.models.zimage import loading

    return {"vae": _load(ctx, loading.load_vae, "vae", params["file"])}


@runner("load/text-encoder")
def load_text_encoder(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    from workers.models.zimage import loading

    return {"encoder": _load(ctx, loading.load_text_encoder, "text_encoders", params["file"])}


@runner("encode/text")
def encode_text(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    encoder = _expect(inputs, "encoder", TextEncoder)
    text = str(inputs.get("text", params.get("text", "")))
    return {"conditioning": Conditioning(_encode(encoder, text), text, encoder)}


@runner("latent/empty")
def latent_empty(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    import torch

    from workers.models.zimage import engine

    shape = _checked(lambda: engine.latent_shape(params["width"], params["height"]))
    return {"latent": Latent(on_device_thread(torch.zeros, shape), empty=True)}


@runner("sample")
def sample(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    """Denoise `latent` (pure noise at denoise 1.0; else re-noised to the schedule's start)."""
    import torch

    from workers.models.zimage import engine

    model = _expect(inputs, "model", DiffusionModel)
    positive = _expect(inputs, "positive", Conditioning)
    latent = _expect(inputs, "latent", Latent)
    negative = inputs.get("negative")
    seed, steps = int(inputs.get("seed", params["seed"])), int(params["steps"])
    guidance, denoise = float(params["guidance"]), float(params["denoise"])
    channels = model.transformer.config.in_channels
    if latent.samples.shape[1] != channels:
        raise NodeFailed(
            f"the latent has {latent.samples.shape[1]} channels; {model.name} expects {channels}"
        )
    width, height = latent.pixel_size
    sigmas, timesteps = _checked(lambda: engine.sigma_schedule(steps, width, height, denoise))
    device = model.placement.device

    def start_latents() -> Any:
        generator = torch.Generator("cpu").manual_seed(seed)
        eps = engine.noise(tuple(latent.samples.shape), generator, device)
        return eps if denoise >= 1.0 else engine.renoise(latent.samples.to(device), eps, sigmas[0])

    start = on_device_thread(start_latents)
    neg = _negative_embeds(positive, negative, guidance)
    ctx.note_lineage(seed=seed)
    out = _denoise(ctx, model, start, sigmas, timesteps, positive.embeds, neg, guidance)
    return {"latent": Latent(out)}


@runner("vae/decode")
def vae_decode(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    vae, latent = _expect(inputs, "vae", Vae), _expect(inputs, "latent", Latent)
    return {"image": _decode(vae, latent.samples)}


@runner("vae/encode")
def vae_encode(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    """Encode an RGB image to its VAE posterior's mode (deterministic: no seed here)."""
    from workers.models.zimage import engine

    vae, image = _expect(inputs, "vae", Vae), _rgb(inputs)
    return {"latent": Latent(_checked(lambda: on_device_thread(engine.encode_image, vae, image)))}


@runner("zimage/turbo")
def zimage_turbo(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    """Text-to-image, or img2img when `image` is wired (resized to width×height with Lanczos
    when its size differs). Reproduces ZImagePipeline / ZImageImg2ImgPipeline for the same
    files, prompt, size, steps, guidance, strength and seed."""
    import torch

    from workers.models.zimage import engine, loading

    model = _load(ctx, loading.load_diffusion_model, "diffusion_models", params["model"])
    vae = _load(ctx, loading.load_vae, "vae", params["vae"])
    encoder = _load(ctx, loading.load_text_encoder, "text_encoders", params["text_encoder"])
    prompt = str(inputs.get("prompt", params["prompt"]))
    seed, steps = int(inputs.get("seed", params["seed"])), int(params["steps"])
    width, height, guidance = int(params["width"]), int(params["height"]), float(params["guidance"])
    shape = _checked(lambda: engine.latent_shape(width, height))

    positive = _encode(encoder, prompt)
    negative = _encode(encoder, params["negative_prompt"]) if guidance > 0 else None
    generator, device = torch.Generator("cpu").manual_seed(seed), model.placement.device
    if inputs.get("image") is None:
        sigmas, timesteps = _checked(lambda: engine.sigma_schedule(steps, width, height))
        start = on_device_thread(engine.noise, shape, generator, device)
    else:
        image = _rgb(inputs)
        if image.size != (width, height):
            from PIL import Image

            image = image.resize((width, height), Image.Resampling.LANCZOS)
        strength = float(params["strength"])
        sigmas, timesteps = _checked(lambda: engine.sigma_schedule(steps, width, height, strength))

        def img2img_start() -> Any:
            init = engine.encode_image(vae, image, generator)  # draws before the noise, as diffusers
            return engine.renoise(init.to(device), engine.noise(shape, generator, device), sigmas[0])

        start = on_device_thread(img2img_start)
    ctx.note_lineage(seed=seed)
    out = _denoise(ctx, model, start, sigmas, timesteps, positive, negative, guidance, preview=vae)
    return {"image": _decode(vae, out)}


def _denoise(
    ctx: NodeContext,
    model: DiffusionModel,
    start: Any,
    sigmas: Any,
    timesteps: Any,
    positive: Any,
    negative: Any,
    guidance: float,
    preview: Vae | None = None,
) -> Any:
    """Submit one SampleJob to the model's step batcher; returns latents [1, 16, h, w].

    With `preview` (the VAE that will decode the result), progress carries a small preview of
    the current estimate at most every INLINE_PREVIEW_SECONDS (0: every step).
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
    )
    job.on_progress = _progress_reporter(ctx, job, preview)
    from workers.parallel.worker import denoiser

    group = denoiser()  # a group worker (xfuser.<n>): its ranks split the denoise
    try:
        return model.batcher.run(job) if group is None else group.run(ctx, model, job)
    except torch.OutOfMemoryError as exc:
        raise NodeFailed(f"out of device memory while sampling with {model.name}: {exc}") from exc


def _progress_reporter(ctx: NodeContext, job: Any, vae: Vae | None) -> Callable[[int, int], None]:
    """`on_progress` for a job: reports every step, with a preview when one is due."""
    import time

    interval = _preview_seconds()
    last = [float("-inf")]

    def report(done: int, total: int) -> None:
        png = None
        now = time.monotonic()
        if vae is not None and interval is not None and done < total and now - last[0] >= interval:
            from workers.models.zimage.preview import preview_pixels, preview_png

            # The device thread computes the pixels; the PNG is encoded here, on the slot's
            # thread, so no other slot's next step waits behind it.
            png = preview_png(on_device_thread(preview_pixels, vae, job.latents,
                                               job.sigmas[done], job.velocity))
            last[0] = now
        ctx.progress(done, total, png, batch=job.batch)

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
        return _encode(positive.encoder, "")
    if not isinstance(negative, Conditioning):
        raise NodeFailed(f"input 'negative' must be conditioning, got {type(negative).__name__}")
    return negative.embeds


def _encode(encoder: TextEncoder, text: str) -> Any:
    """Caption embeds [L, D] of `text`, in one encoder call with other slots' texts that are
    waiting at the same moment (the worker's batched encoder); alone, the pipeline's call."""
    from workers.models.zimage import engine

    if encoder.batched is None:
        return on_device_thread(engine.encode_prompt, encoder, text)
    return encoder.batched.call(text)


def _decode(vae: Vae, latents: Any) -> Any:
    """The image of latents [1, 16, h, w], decoded together with same-size latents of other
    slots waiting at the same moment; alone, the pipeline's decode."""
    from workers.models.zimage import engine

    if vae.batched is None:
        return on_device_thread(engine.decode_latents, vae, latents)
    return vae.batched.call(latents)


def _load(ctx: NodeContext, load: Callable[..., Any], folder: str, name: str) -> Any:
    """Load a model file through the per-process cache; note its sha256 in the lineage.

    On a CPU worker the load runs on the device thread (copying weights runs torch's parallel
    kernels); on a GPU it stays on the slot, so a load never stalls the other slots' sampling."""
    from workers.models.zimage.loading import ModelLoadError

    try:
        if ctx.policy.device == "cpu":
            value = on_device_thread(load, ctx.models_dir, name, ctx.policy)
        else:
            value = load(ctx.models_dir, name, ctx.policy)
    except (ModelFileMissing, ModelLoadError) as exc:
        raise NodeFailed(str(exc)) from exc
    models = {**ctx.lineage.get("models", {}), f"{folder}/{name}": value.sha256}
    ctx.note_lineage(models=models)
    return value


def _expect(inputs: dict[str, Any], port: str, kind: type) -> Any:
    value = inputs.get(port)
    if not isinstance(value, kind):
        got = "nothing" if value is None else type(value).__name__
        raise NodeFailed(f"input {port!r} must be a {kind.__name__}, got {got}")
    return value


def _rgb(inputs: dict[str, Any]) -> Any:
    from PIL import Image

    image = _expect(inputs, "image", Image.Image)
    if image.mode != "RGB":
        raise NodeFailed(f"input 'image' must be an RGB image, got mode {image.mode}")
    return image


def _checked(compute: Callable[[], Any]) -> Any:
    """Run `compute`; a ValueError (bad size, no step left to run) becomes a NodeFailed."""
    try:
        return compute()
    except ValueError as exc:
        raise NodeFailed(str(exc)) from exc
