"""The `zimage/turbo` node: Z-Image Turbo in one node, on the generic nodes' helpers
(workers/runners/diffusion.py). Registered with the family (FAMILY.nodes)."""

from __future__ import annotations

from typing import Any

from workers.device.thread import on_device_thread
from workers.runners.base import NodeContext, runner
from workers.runners.diffusion import checked, decode, denoise_job, encode, load_file, rgb

FAMILY = "zimage"


@runner("zimage/turbo")
def zimage_turbo(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    """Text-to-image, or img2img when `image` is wired (resized to width×height with Lanczos
    when its size differs). Reproduces ZImagePipeline / ZImageImg2ImgPipeline for the same
    files, prompt, size, steps, guidance, strength and seed."""
    import torch

    from workers.models.zimage import engine

    model = load_file(ctx, "diffusion_models", params["model"], family=FAMILY)
    vae = load_file(ctx, "vae", params["vae"], family=FAMILY)
    encoder = load_file(ctx, "text_encoders", params["text_encoder"], family=FAMILY)
    prompt = str(inputs.get("prompt", params["prompt"]))
    seed, steps = int(inputs.get("seed", params["seed"])), int(params["steps"])
    width, height, guidance = int(params["width"]), int(params["height"]), float(params["guidance"])
    shape = checked(lambda: engine.latent_shape(width, height))

    positive = encode(encoder, prompt)
    negative = encode(encoder, params["negative_prompt"]) if guidance > 0 else None
    generator, device = torch.Generator("cpu").manual_seed(seed), model.placement.device
    if inputs.get("image") is None:
        sigmas, timesteps = checked(lambda: engine.sigma_schedule(steps, width, height))
        start = on_device_thread(engine.noise, shape, generator, device)
    else:
        image = rgb(inputs)
        if image.size != (width, height):
            from PIL import Image

            image = image.resize((width, height), Image.Resampling.LANCZOS)
        strength = float(params["strength"])
        sigmas, timesteps = checked(lambda: engine.sigma_schedule(steps, width, height, strength))

        def img2img_start() -> Any:
            init = engine.encode_image(vae, image, generator)  # draws before the noise, as diffusers
            return engine.renoise(init.to(device), engine.noise(shape, generator, device), sigmas[0])

        start = on_device_thread(img2img_start)
    ctx.note_lineage(seed=seed)
    out = denoise_job(ctx, model, start, sigmas, timesteps, positive, negative, guidance, preview=vae)
    return {"image": decode(vae, out)}
