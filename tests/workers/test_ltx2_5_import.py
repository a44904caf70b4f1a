"""ComfyUI's shipped LTX-2.5 templates imported from the UI format with the tiny LTX-2.5
stack's files and rendered through the real executor into an MP4 with sound: video_ltx2_5_t2v
and video_ltx2_5_i2v (a subgraph loading ComfyUI's separate files — UNETLoader, a VAELoader
each for the video and the audio VAE, CLIPLoader type ltxv for the Gemma 4 "with proj" — two
stages over ManualSigmas with the latent upsampler between them, the prompt enhancer switched
off; its ResolutionSelector cut away for the tiny size), and video_ltx2_5_flf2v (one stage, its
keyframe guides at the first and last frames)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from apps.importer.services import comfy_import
from tests.workers.helpers import noise_image
from tests.workers.vocab_helpers import (
    assert_mp4_with_sound,
    asset_of,
    cut_resolution_selector,
    render,
)

SIDE, SECONDS, FPS = 64, 1, 8  # the final clip: 64² px, 1 s × 8 fps + 1 = 9 frames


@pytest.mark.django_db
@pytest.mark.parametrize("template", ["video_ltx2_5_t2v", "video_ltx2_5_i2v"])
def test_comfyuis_shipped_ltx2_5_template_imports_and_renders(settings, tmp_path, template):
    from apps.importer.comfy_templates import shipped_file
    from workers.models.ltx2.tiny import write_tiny_files, write_tiny_upsampler

    models_dir = tmp_path / "models"
    files = write_tiny_files(models_dir)
    upsampler = write_tiny_upsampler(models_dir)["latent_upscaler"]
    settings.INLINE_BLOB_DIR, settings.INLINE_MODELS_DIR = tmp_path / "blobs", models_dir
    workflow: dict[str, Any] = json.loads(shipped_file(f"{template}.json") or b"{}")
    ids = {s["id"] for s in workflow["definitions"]["subgraphs"]}
    clip = next(n for n in workflow["nodes"] if n["type"] in ids)
    cut_resolution_selector(workflow, clip)
    values = clip["widgets_values"]  # in the subgraph's widget inputs' order
    assert values[1] is False  # prompt enhancement off: the switch routes around the enhancer
    values[2:5], values[6] = [SECONDS, SIDE, SIDE], FPS  # duration, width, height; fps
    values[7:12] = [files["diffusion_model"], files["vae"], files["audio_vae"],
                    files["text_encoder"], upsampler]
    assets = {"neon_cyborg_portrait.png": asset_of(noise_image(96, 64, seed=3))}
    catalog = {"diffusion_models": [files["diffusion_model"]],
               "vae": [files["vae"], files["audio_vae"]],
               "text_encoders": [files["text_encoder"]], "latent_upscale_models": [upsampler]}
    held = {(folder, name): ("ltx2",) for folder, names in catalog.items() for name in names}
    result = comfy_import(workflow=workflow, catalog=catalog, files=held,
                          resolve_asset=assets.get)
    assert result.report.format == "ui"
    assert result.report.unmapped == []
    nodes = result.graph.model_dump()["nodes"]
    loads = {n["type"] for n in nodes.values()
             if n["type"].startswith("load/") or n["type"] == "ltx2/load-files"}
    assert loads == {"ltx2/load-files", "load/latent-upscale-model"}
    [params] = {json.dumps(n["params"], sort_keys=True) for n in nodes.values()
                if n["type"] == "ltx2/load-files"}
    assert json.loads(params) == {"diffusion_model": files["diffusion_model"], "vae": files["vae"],
                                  "audio_vae": files["audio_vae"],
                                  "text_encoder": files["text_encoder"]}
    assert [n["type"] for n in nodes.values()].count("ltx2/sample") == 2
    outcome, run = render(nodes, result.target)
    assert outcome.status == "succeeded", outcome.error
    assert_mp4_with_sound(run, side=SIDE, fps=FPS, frames=SECONDS * FPS + 1)


@pytest.mark.django_db
def test_comfyuis_shipped_ltx2_5_first_last_frame_template_imports_and_renders(settings,
                                                                              tmp_path):
    """video_ltx2_5_flf2v: its two LTXVAddGuide (frame 0 and -1, strength 0.7, each image
    through LTXVPreprocess) become ltx2/add-guide with the images' crf, LTXVCropGuides folds
    into ltx2/sample, and the clip renders at the clip's length (the guides cropped off)."""
    from apps.importer.comfy_templates import shipped_file
    from workers.models.ltx2.tiny import write_tiny_files

    models_dir = tmp_path / "models"
    files = write_tiny_files(models_dir)
    settings.INLINE_BLOB_DIR, settings.INLINE_MODELS_DIR = tmp_path / "blobs", models_dir
    workflow: dict[str, Any] = json.loads(shipped_file("video_ltx2_5_flf2v.json") or b"{}")
    ids = {s["id"] for s in workflow["definitions"]["subgraphs"]}
    clip = next(n for n in workflow["nodes"] if n["type"] in ids)
    values = clip["widgets_values"]  # in the subgraph's widget inputs' order
    assert values[1] is False  # prompt enhancement off: the switch routes around the enhancer
    values[2:5], values[6] = [SECONDS, SIDE, SIDE], FPS  # duration, width, height; fps
    values[7:11] = [files["diffusion_model"], files["vae"], files["audio_vae"],
                    files["text_encoder"]]
    assets = {"robot_hand.png": asset_of(noise_image(96, 64, seed=3)),
              "robot_hand_energy.png": asset_of(noise_image(64, 96, seed=4))}
    catalog = {"diffusion_models": [files["diffusion_model"]],
               "vae": [files["vae"], files["audio_vae"]],
               "text_encoders": [files["text_encoder"]]}
    held = {(folder, name): ("ltx2",) for folder, names in catalog.items() for name in names}
    result = comfy_import(workflow=workflow, catalog=catalog, files=held,
                          resolve_asset=assets.get)
    assert result.report.unmapped == []
    nodes = result.graph.model_dump()["nodes"]
    guides = sorted((n["params"]["frame_idx"], n["params"]["strength"], n["params"]["crf"])
                    for n in nodes.values() if n["type"] == "ltx2/add-guide")
    assert guides == [(-1, 0.7, 18), (0, 0.7, 18)]
    [sample] = [n for n in nodes.values() if n["type"] == "ltx2/sample"]
    assert nodes[sample["inputs"]["latent"]["node"]]["type"] == "ltx2/add-guide"
    outcome, run = render(nodes, result.target)
    assert outcome.status == "succeeded", outcome.error
    assert_mp4_with_sound(run, side=SIDE, fps=FPS, frames=SECONDS * FPS + 1)
