"""Qwen-Image-Edit's node, `qwenimage/edit` (ComfyUI's TextEncodeQwenImageEdit and
TextEncodeQwenImageEditPlus): a prompt encoded by the Qwen2.5-VL together with 1–3 reference
images (vl.py, as the edit pipelines do it), and — when a VAE is wired — the images as
reference latents the transformer reads beside the image it denoises. Registered with the
family (FAMILY.nodes)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from workers.device.thread import on_device_thread
from workers.models.values import Conditioning, Latent, TextEncoder, Vae
from workers.runners.base import NodeContext, NodeFailed, runner
from workers.runners.diffusion import checked, expect

FAMILY = "qwenimage"
IMAGE_PORTS = ("image", "image_2", "image_3")


@runner("qwenimage/edit")
def qwenimage_edit(ctx: NodeContext, params: dict[str, Any], inputs: dict[str, Any]):
    """The conditioning of `text` with the wired images (port order), Edit Plus or Edit."""
    from workers.models.qwenimage import vl
    from workers.models.qwenimage.engine import QwenPrompt

    encoder = expect(inputs, "encoder", TextEncoder)
    vae = inputs.get("vae")
    _check_family(encoder, vae)
    variant, text = str(params.get("variant", "plus")), str(inputs.get("text", params["text"]))
    images = _images(inputs, variant)
    area = round(float(params.get("megapixels", 1.0)) * vl.VAE_AREA)
    processor = _processor(encoder)

    def encoded() -> Any:
        from workers.models.lora import rows

        shown = vl.condition_images(images, variant, area)
        with rows([encoder.loras]):
            embeds = vl.encode_prompt(encoder.model, processor, text, shown, variant,
                                      encoder.placement.device)
        refs = tuple(vl.encode_reference(vae, image, area) for image in images) if vae else ()
        return QwenPrompt(embeds, refs)

    prompt = checked(lambda: on_device_thread(encoded))
    return {"conditioning": Conditioning(prompt, text, encoder)}


def _check_family(encoder: TextEncoder, vae: Any) -> None:
    if encoder.family != FAMILY:
        raise NodeFailed(f"input 'encoder' is {encoder.name} ({encoder.family}); Qwen-Image-Edit "
                         "encodes with Qwen-Image's Qwen2.5-VL")
    if vae is not None and (not isinstance(vae, Vae) or vae.family != FAMILY):
        raise NodeFailed("input 'vae' must be Qwen-Image's VAE (it encodes the reference latents)")


def _images(inputs: dict[str, Any], variant: str) -> list[Any]:
    from PIL import Image

    from workers.models.qwenimage.vl import MAX_IMAGES

    images = [inputs[port] for port in IMAGE_PORTS if inputs.get(port) is not None]
    for image in images:
        if not isinstance(image, Image.Image) or image.mode != "RGB":
            raise NodeFailed("reference images must be RGB images")
    if len(images) > MAX_IMAGES[variant]:
        raise NodeFailed(f"Qwen-Image-Edit ({variant}) takes at most {MAX_IMAGES[variant]} "
                         f"image(s), got {len(images)}; use the `plus` variant (2509 / 2511)")
    return images


def _processor(encoder: TextEncoder) -> Any:
    from workers.models.qwenimage.engine import Tokenizers

    tokenizers = encoder.tokenizer
    if not isinstance(tokenizers, Tokenizers) or tokenizers.processor is None:
        where = tokenizers.folder if isinstance(tokenizers, Tokenizers) else "its tokenizer folder"
        raise NodeFailed(f"text encoder {encoder.name} has no Qwen2-VL processor: put its "
                         f"processor files (preprocessor_config.json, …) in {where}/")
    return tokenizers.processor


@runner("qwenimage/reference-latent")
def qwenimage_reference_latent(ctx: NodeContext, params: dict[str, Any],
                               inputs: dict[str, Any]):
    """ComfyUI's ReferenceLatent on a Qwen-Image prompt: `latent` (Qwen-Image's [1, 16, h, w],
    e.g. a `vae/encode` of the reference image) appended to the prompt's reference latents;
    and ComfyUI's FluxKontextMultiReferenceLatentMethod: `method` other than auto sets whether
    the transformer reads the prompt's references at timestep 0."""
    from workers.models.qwenimage.engine import QwenPrompt

    conditioning = expect(inputs, "conditioning", Conditioning)
    if conditioning.encoder.family != FAMILY:
        raise NodeFailed(f"input 'conditioning' is {conditioning.encoder.name}'s "
                         f"({conditioning.encoder.family}); qwenimage/reference-latent conditions "
                         "Qwen-Image prompts")
    prompt = conditioning.embeds
    if not isinstance(prompt, QwenPrompt):
        prompt = QwenPrompt(prompt)
    if inputs.get("latent") is not None:
        prompt = prompt._replace(references=(*prompt.references, _reference(inputs)))
    method = str(params.get("method", "auto"))
    if method != "auto":
        prompt = prompt._replace(timestep_zero=method == "index_timestep_zero")
    return {"conditioning": replace(conditioning, embeds=prompt)}


def _reference(inputs: dict[str, Any]) -> Any:
    from workers.models.qwenimage import LATENT

    latent = expect(inputs, "latent", Latent)
    samples = latent.samples
    if latent.empty or samples.ndim != 4 or samples.shape[1] != LATENT.channels:
        raise NodeFailed(f"input 'latent' must be a Qwen-Image latent [1, {LATENT.channels}, h, w] "
                         f"(a Qwen-Image VAE's encode), got {tuple(samples.shape)}")
    return samples.float()
