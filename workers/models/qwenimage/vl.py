"""Qwen-Image-Edit's prompt encoding with images, as `QwenImageEditPipeline` and
`QwenImageEditPlusPipeline` do it (the diffusers pipelines are the reference): each image
resized for the Qwen2.5-VL (Edit: to ~1 MP; Edit Plus: to ~384² px, "Picture N:" labels before
the prompt), the Qwen2-VL processor's image tokens and pixels, the VL model's last hidden state
under the edit template with its 64 template tokens dropped; and each image resized again
(~1 MP by default) and VAE-encoded as a reference latent (its distribution's mode, normalised
by the VAE's per-channel mean and std, as the pipelines divide)."""

from __future__ import annotations

import math
from typing import Any

import torch
from PIL import Image
from transformers import Qwen2VLProcessor
from transformers.processing_utils import ProcessorMixin

from workers.models.qwenimage import LATENT
from workers.models.values import Vae

EDIT_TEMPLATE = (
    "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, "
    "texture, objects, background), then explain how the user's text instruction should alter "
    "or modify the image. Generate a new image that meets the user's requirements while "
    "maintaining consistency with the original input where appropriate.<|im_end|>\n"
    "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n")
EDIT_TEMPLATE_TOKENS = 64  # the pipelines' prompt_template_encode_start_idx
VISION = "<|vision_start|><|image_pad|><|vision_end|>"
PICTURE = "Picture {}: " + VISION  # Edit Plus labels each image
VARIANTS = ("plus", "edit")  # Qwen-Image-Edit-2509 / 2511, Qwen-Image-Edit
CONDITION_AREA = 384 * 384  # Edit Plus: the VL's images (the pipeline's CONDITION_IMAGE_SIZE)
VAE_AREA = 1024 * 1024  # the reference latents' images (the pipelines' VAE_IMAGE_SIZE)
MAX_IMAGES = {"plus": 3, "edit": 1}


class ImageTextProcessor(Qwen2VLProcessor):
    """Qwen2VLProcessor without its video half: transformers 5 checks a video processor whose
    class needs torchvision, which the farm does not install; images and text are processed as
    Qwen2VLProcessor processes them (its own methods)."""

    def __init__(self, image_processor: Any = None, tokenizer: Any = None,
                 chat_template: Any = None, **kwargs: Any) -> None:
        self.image_token = getattr(tokenizer, "image_token", None) or "<|image_pad|>"
        self.video_token = getattr(tokenizer, "video_token", None) or "<|video_pad|>"
        self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
        self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)


def dimensions(area: int, width: int, height: int) -> tuple[int, int]:
    """(width, height) of about `area` pixels at the image's aspect ratio, each a multiple of
    32 (the pipelines' calculate_dimensions)."""
    ratio = width / height
    w = math.sqrt(area * ratio)
    h = w / ratio
    return round(w / 32) * 32, round(h / 32) * 32


def _image_processor() -> Any:
    from diffusers.image_processor import VaeImageProcessor

    return VaeImageProcessor(vae_scale_factor=LATENT.pixel_multiple)


def condition_images(images: list[Image.Image], variant: str,
                     vae_area: int = VAE_AREA) -> list[Image.Image]:
    """The images the VL sees: Edit Plus ~384² px each, Edit its one image at the VAE's size."""
    processor = _image_processor()
    area = CONDITION_AREA if variant == "plus" else vae_area
    sized = [dimensions(area, image.width, image.height) for image in images]
    return [processor.resize(image, h, w) for image, (w, h) in zip(images, sized, strict=True)]


@torch.no_grad()
def encode_prompt(model: Any, processor: Any, text: str, images: list[Image.Image],
                  variant: str, device: Any) -> torch.Tensor:
    """A prompt's embeddings [L, D] encoded with its (already resized) images, the pipelines'
    `_get_qwen_prompt_embeds` for one prompt."""
    prefix = "".join(PICTURE.format(i + 1) for i in range(len(images))) if variant == "plus" \
        else VISION * len(images)
    inputs = processor(text=[EDIT_TEMPLATE.format(prefix + text)], images=images or None,
                       padding=True, return_tensors="pt").to(device)
    hidden = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                   pixel_values=inputs.get("pixel_values"),
                   image_grid_thw=inputs.get("image_grid_thw"),
                   output_hidden_states=True).hidden_states[-1]  # [1, T, D]
    mask = inputs["attention_mask"][0].bool()
    return hidden[0][mask][EDIT_TEMPLATE_TOKENS:].to(model.dtype)  # [L, D]


@torch.no_grad()
def encode_reference(vae: Vae, image: Image.Image, area: int = VAE_AREA) -> torch.Tensor:
    """A reference image's latents [1, 16, h, w] float32: resized to ~`area` px (multiples of
    32), the posterior's mode, (x − mean) / std per channel, as the edit pipelines encode it."""
    width, height = dimensions(area, image.width, image.height)
    pixels = _image_processor().preprocess(image, height, width).unsqueeze(2)  # [1, 3, 1, H, W]
    module = vae.module
    latents = module.encode(pixels.to(device=vae.placement.device, dtype=module.dtype)
                            ).latent_dist.mode()  # [1, 16, 1, h, w]
    cfg = module.config
    mean = torch.tensor(cfg.latents_mean).view(1, cfg.z_dim, 1, 1, 1).to(latents.device,
                                                                         latents.dtype)
    std = torch.tensor(cfg.latents_std).view(1, cfg.z_dim, 1, 1, 1).to(latents.device,
                                                                       latents.dtype)
    return ((latents - mean) / std)[:, :, 0].float()
