"""ComfyUI's shipped FLUX.1 Fill templates imported from the UI format with the tiny FLUX.1 files
and rendered through the real executor: `flux_fill_inpaint_example` (a subgraph: UNETLoader of
FLUX.1 Fill, DualCLIPLoader, VAELoader, FluxGuidance 30 → InpaintModelConditioning with a
ConditioningZeroOut negative, DifferentialDiffusion, KSampler euler / normal, VAEDecode; the
image and its mask from one LoadImage), `flux_fill_outpaint_example` (ImagePadForOutpaint, no
noise mask) and `image_flux.1_fill_dev_OneReward` (a LoRA on the Fill model)."""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
import pytest
from PIL import Image

from apps.importer.services import comfy_import
from tests.workers.helpers import noise_image
from tests.workers.vocab_helpers import asset_of, render

W, H, STEPS = 64, 48, 3


def painted(width: int, height: int) -> Image.Image:
    """A noise image whose alpha is the mask's complement (LoadImage: mask = 1 − alpha): opaque
    at the left, fading to clear (repaint) towards the right."""
    alpha = np.tile(np.linspace(255, 0, width).astype("uint8"), (height, 1))
    image = noise_image(width, height, seed=4).convert("RGBA")
    image.putalpha(Image.fromarray(alpha, "L"))
    return image


def tiny_files(workflow: dict[str, Any], names: dict[str, str]) -> None:
    """The template's loaders set to the tiny files, its samplers to STEPS steps, an outpaint
    pad to a few pixels (in place, top level and subgraphs)."""
    inner = [n for s in workflow.get("definitions", {}).get("subgraphs", []) for n in s["nodes"]]
    for node in workflow["nodes"] + inner:
        values = node.get("widgets_values")
        if node["type"] == "UNETLoader":
            values[0] = names["fill"]
        elif node["type"] == "DualCLIPLoader":
            values[:2] = [names["text_encoder"], names["text_encoder_2"]]
        elif node["type"] == "VAELoader":
            values[0] = names["vae"]
        elif node["type"] == "LoraLoaderModelOnly":
            values[0] = names["lora"]
        elif node["type"] == "KSampler":
            assert values[2:7] == [20, 1, "euler", "normal", 1]
            values[2] = STEPS
        elif node["type"] == "ImagePadForOutpaint":
            values[:5] = [16, 0, 16, 16, 8]  # left, top, right, bottom, feathering


@pytest.mark.django_db
@pytest.mark.parametrize("template", ["flux_fill_inpaint_example", "flux_fill_outpaint_example",
                                      "image_flux.1_fill_dev_OneReward"])
def test_comfyuis_shipped_flux_fill_templates_import_and_render(settings, tmp_path, template):
    from apps.importer.comfy_templates import shipped_file
    from apps.takes.storage import blob_read
    from workers.models.flux1.tiny import (
        write_fill_transformer,
        write_smoke_stack,
        write_tiny_lora,
    )

    models_dir = tmp_path / "models"
    names = {**write_smoke_stack(models_dir), "fill": write_fill_transformer(models_dir),
             "lora": write_tiny_lora(models_dir)}
    settings.INLINE_BLOB_DIR, settings.INLINE_MODELS_DIR = tmp_path / "blobs", models_dir
    workflow: dict[str, Any] = json.loads(shipped_file(f"{template}.json") or b"{}")
    tiny_files(workflow, names)
    image = asset_of(painted(W, H))
    catalog = {"diffusion_models": [names["fill"]], "vae": [names["vae"]], "loras": [names["lora"]],
               "text_encoders": [names["text_encoder"], names["text_encoder_2"]]}
    held = {(folder, name): ("flux1",) for folder, files in catalog.items() for name in files}
    result = comfy_import(workflow=workflow, catalog=catalog, files=held,
                          resolve_asset=lambda name: image)
    assert result.report.format == "ui" and result.report.unmapped == []
    nodes = result.graph.model_dump()["nodes"]
    for sampler in (n for n in nodes.values() if n["type"] == "sample"):
        assert sampler["params"]["guidance"] == 30.0  # FluxGuidance, seen through the inpaint
        assert "negative" not in sampler["inputs"]  # ConditioningZeroOut's, cut (cfg 1)
        assert nodes[sampler["inputs"]["model"]["node"]]["type"] == "model/differential-diffusion"
    outcome, run = render(nodes, result.target)
    assert outcome.status == "succeeded", outcome.error
    sizes = [Image.open(io.BytesIO(blob_read(t.sha256))).size for t in run.takes.all()]
    assert sizes and all(size in ((W, H), (W + 32, H + 16)) for size in sizes)
