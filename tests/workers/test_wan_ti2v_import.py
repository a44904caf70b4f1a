"""ComfyUI's Wan 2.2 TI2V-5B image-to-video template in the UI format (UNETLoader, the `wan`
CLIPLoader, VAELoader, ModelSamplingSD3, LoadImage → Wan22ImageToVideoLatent → KSampler →
VAEDecode → one frame saved) imported onto the farm's nodes and rendered through the real
executor on the real database with the tiny TI2V stack: its first frame is the pipeline's."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from apps.importer.services import comfy_import
from tests.apps.importer.builder import Ui
from tests.workers.helpers import noise_image
from tests.workers.vocab_helpers import asset_of, render

pytestmark = pytest.mark.django_db
W, H, FRAMES, STEPS, CFG, SEED = 64, 32, 5, 4, 5.0, 11
PROMPT, NEGATIVE = "a paper boat on a puddle", "blurry"


@pytest.fixture(scope="module")
def names(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[str, str]]:
    from workers.models.wan.tiny import write_smoke_stack

    models_dir = tmp_path_factory.mktemp("ti2v-import-models")
    return models_dir, write_smoke_stack(models_dir)


def ti2v_ui(names: dict[str, str]) -> dict[str, Any]:
    ui = Ui()
    ui.add(1, "UNETLoader", [names["model_ti2v"], "default"], outputs=["MODEL"])
    ui.add(2, "CLIPLoader", [names["text_encoder"], "wan", "default"], outputs=["CLIP"])
    ui.add(3, "VAELoader", [names["vae_22"]], outputs=["VAE"])
    ui.add(4, "ModelSamplingSD3", [8], inputs=[("model", "MODEL")], outputs=["MODEL"])
    for node, text in ((5, PROMPT), (6, NEGATIVE)):
        ui.add(node, "CLIPTextEncode", [text], inputs=[("clip", "CLIP"), ("text", "STRING", True)],
               outputs=["CONDITIONING"])
    ui.add(7, "LoadImage", ["start.png", "image"], outputs=["IMAGE", "MASK"])
    ui.add(8, "Wan22ImageToVideoLatent", [W, H, FRAMES, 1],
           inputs=[("vae", "VAE"), ("start_image", "IMAGE")], outputs=["LATENT"])
    ui.add(9, "KSampler", [SEED, "fixed", STEPS, CFG, "euler", "simple", 1],
           inputs=[("model", "MODEL"), ("positive", "CONDITIONING"), ("negative", "CONDITIONING"),
                   ("latent_image", "LATENT")], outputs=["LATENT"])
    ui.add(10, "VAEDecode", [], inputs=[("samples", "LATENT"), ("vae", "VAE")], outputs=["IMAGE"])
    ui.add(11, "ImageFromBatch", [0, 1], inputs=[("image", "IMAGE")], outputs=["IMAGE"])
    ui.add(12, "SaveImage", ["ti2v"], inputs=[("images", "IMAGE")])
    (ui.link(1, 0, 4, "model").link(4, 0, 9, "model").link(2, 0, 5, "clip").link(2, 0, 6, "clip")
       .link(5, 0, 9, "positive").link(6, 0, 9, "negative").link(3, 0, 8, "vae")
       .link(7, 0, 8, "start_image").link(8, 0, 9, "latent_image").link(9, 0, 10, "samples")
       .link(3, 0, 10, "vae").link(10, 0, 11, "image").link(11, 0, 12, "images"))
    return ui.doc()


def pipeline_first_frame(start: Image.Image) -> np.ndarray:
    from workers.models.wan.engine import to_uint8
    from workers.models.wan.tiny import smoke_pipeline

    pos, neg = smoke_pipeline().encode_prompt(PROMPT, NEGATIVE, max_sequence_length=512)
    out = smoke_pipeline(ti2v=True, i2v=True)(
        image=start, prompt_embeds=pos, negative_prompt_embeds=neg, height=H, width=W,
        num_frames=FRAMES, num_inference_steps=STEPS, guidance_scale=CFG, output_type="np",
        generator=torch.Generator("cpu").manual_seed(SEED)).frames
    return to_uint8(np.asarray(out[0]))[0]


def test_comfyui_s_ti2v_5b_image_to_video_imports_and_renders_the_pipeline_s_frame(
        names, settings, tmp_path):
    from apps.takes.storage import blob_read

    models_dir, held = names
    settings.INLINE_BLOB_DIR, settings.INLINE_MODELS_DIR = tmp_path / "blobs", models_dir
    start = noise_image(W, H, seed=5)
    asset = asset_of(start)
    catalog = {"diffusion_models": [held["model_ti2v"]], "text_encoders": [held["text_encoder"]],
               "vae": [held["vae_22"]]}
    files = {("diffusion_models", held["model_ti2v"]): ("wan",),
             ("text_encoders", held["text_encoder"]): ("wan",), ("vae", held["vae_22"]): ("wan",)}
    result = comfy_import(workflow=ti2v_ui(held), catalog=catalog, files=files,
                          resolve_asset=lambda name: asset if name == "start.png" else None)
    assert result.report.unmapped == []
    nodes = result.graph.model_dump()["nodes"]
    assert nodes["8"]["type"] == "wan/ti2v-latent"
    assert nodes["8"]["params"] == {"width": W, "height": H, "length": FRAMES, "batch": 1}
    assert set(nodes["8"]["inputs"]) == {"vae", "start_image"}
    assert nodes["10"]["type"] == "vae/decode-video"
    assert (nodes["9"]["params"]["sampler"], nodes["9"]["params"]["scheduler"]) == (
        "euler", "simple")
    outcome, run = render(nodes, result.target)
    assert outcome.status == "succeeded", outcome.error
    [take] = run.takes.all()
    still = np.asarray(Image.open(io.BytesIO(blob_read(take.sha256))).convert("RGB"))
    # The first frame is the start image's latent frame, kept while the rest is sampled (and
    # the causal VAE decodes it alone): the pipeline's, bit for bit. The later frames follow
    # ComfyUI's `simple` schedule, not the pipeline's (tests/workers/test_wan_ti2v.py compares
    # those with the farm's default schedule).
    assert np.array_equal(still, pipeline_first_frame(start))
