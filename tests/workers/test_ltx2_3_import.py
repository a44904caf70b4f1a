"""ComfyUI's shipped LTX-2.3 image-to-video template (video_ltx2_3_i2v: a subgraph, two stages —
a half-size clip over the distilled ManualSigmas with the distilled LoRA, its first frame at
strength 0.7, its latents upsampled ×2, the first frame conditioned again and refined from
σ 0.85 — its prompt enhancer switched off) imported from the UI format with the tiny stack's
files (ComfyUI's single checkpoint file, the latent upsampler, the LoRA) and rendered through the
real executor into an MP4 with sound."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from apps.importer.services import comfy_import
from tests.workers.helpers import noise_image
from tests.workers.vocab_helpers import asset_of, render

SIDE, SECONDS, FPS = 64, 1, 8  # the final clip: 64² px, 1 s × 8 fps + 1 = 9 frames


@pytest.mark.django_db
def test_comfyuis_shipped_ltx2_3_i2v_template_imports_and_renders(settings, tmp_path):
    import av

    from apps.importer.comfy_templates import shipped_file
    from apps.takes.storage import blob_read
    from workers.models.ltx2.tiny import (
        write_tiny_lora,
        write_tiny_single_file,
        write_tiny_upsampler,
    )

    models_dir = tmp_path / "models"
    checkpoint = write_tiny_single_file(models_dir, name="smoke-ltx2")["checkpoint"]
    upsampler = write_tiny_upsampler(models_dir)["latent_upscaler"]
    lora = write_tiny_lora(models_dir)
    settings.INLINE_BLOB_DIR, settings.INLINE_MODELS_DIR = tmp_path / "blobs", models_dir
    workflow: dict[str, Any] = json.loads(shipped_file("video_ltx2_3_i2v.json") or b"{}")
    ids = {s["id"] for s in workflow["definitions"]["subgraphs"]}
    clip = next(n for n in workflow["nodes"] if n["type"] in ids)
    values = clip["widgets_values"]  # in the subgraph's input order (after first_frame)
    assert values[1] is False  # prompt_enhance off: the switch routes around TextGenerateLTX2Prompt
    values[2:6] = [SIDE, SIDE, SECONDS, FPS]  # width, height, duration, fps
    values[7], values[8], values[10] = checkpoint, lora, upsampler
    assets = {"egyptian_queen.png": asset_of(noise_image(96, 64, seed=3))}
    catalog = {"checkpoints": [checkpoint], "latent_upscale_models": [upsampler],
               "loras": [lora]}
    files = {("checkpoints", checkpoint): ("ltx2",),
             ("latent_upscale_models", upsampler): ("ltx2",), ("loras", lora): ("ltx2",)}
    result = comfy_import(workflow=workflow, catalog=catalog, files=files,
                          resolve_asset=assets.get)
    assert result.report.format == "ui"
    assert result.report.unmapped == []  # the enhancer is switched off: cut with its branch
    nodes = result.graph.model_dump()["nodes"]
    stages = [nodes[n] for n in ("320:283", "320:308")]
    assert [s["type"] for s in stages] == ["ltx2/sample"] * 2
    assert [nodes[s["inputs"]["sigmas"]["node"]]["params"]["sigmas"] for s in stages] == [
        "1.0, 0.99375, 0.9875, 0.98125, 0.975, 0.909375, 0.725, 0.421875, 0.0",
        "0.85, 0.7250, 0.4219, 0.0"]
    assert [nodes[n]["params"]["strength"] for n in ("320:296", "320:288")] == [0.7, 1.0]
    assert nodes["320:287"]["type"] == "ltx2/upsample-latent"
    assert stages[1]["inputs"]["latent"] == {"node": "320:288", "port": "latent"}
    assert nodes["320:288"]["inputs"]["latent"] == {"node": "320:287", "port": "latent"}
    outcome, run = render(nodes, result.target)
    assert outcome.status == "succeeded", outcome.error
    [take] = run.takes.all()
    with av.open(io.BytesIO(blob_read(take.sha256)), "r") as mp4:
        stream = mp4.streams.video[0]
        assert (stream.width, stream.height, float(stream.average_rate or 0)) == (SIDE, SIDE, FPS)
        assert len(list(mp4.decode(stream))) == SECONDS * FPS + 1
    with av.open(io.BytesIO(blob_read(take.sha256)), "r") as mp4:
        assert mp4.streams.audio, "the clip has its sound track"
