"""ComfyUI's shipped LTX-2 (19B) image-to-video template, `video_ltx2_i2v`: a subgraph over one
checkpoint whose first stage's size is an EmptyImage at the input image's size scaled by ½
(ComfyUI's way of halving a size: EmptyImage → ImageScaleBy → GetImageSize), two stages with the
latent upsampler between them. Imported from the UI format with the tiny stack's files and
rendered through the real executor into an MP4 with sound."""

from __future__ import annotations

import io

import pytest

from tests.workers.helpers import noise_image
from tests.workers.test_ltx2_3_import import import_tiny, shipped_clip, tiny_files
from tests.workers.vocab_helpers import asset_of, render

SIDE, FRAMES, FPS = 64, 9, 25  # the final clip: 64² px, 9 frames at the template's 25 fps


@pytest.mark.django_db
def test_comfyuis_shipped_ltx2_i2v_template_imports_and_renders(settings, tmp_path):
    import av

    from apps.takes.storage import blob_read

    files = tiny_files(tmp_path / "models")
    settings.INLINE_BLOB_DIR, settings.INLINE_MODELS_DIR = tmp_path / "blobs", tmp_path / "models"
    workflow, values = shipped_clip("video_ltx2_i2v.json")
    # length, prompt, checkpoint, text encoder (the checkpoint's Gemma here), LoRA, upsampler
    values[0], values[2], values[4], values[5] = (FRAMES, files["checkpoints"], files["loras"],
                                                  files["latent_upscale_models"])
    [resize] = [n for n in workflow["nodes"] if n["type"] == "ResizeImageMaskNode"]
    resize["widgets_values"][1:3] = [SIDE, SIDE]  # the image → the final clip's size
    assets = {"freckled_curly_girl.png": asset_of(noise_image(96, 64, seed=3))}
    result = import_tiny(workflow, list(files.items()), assets)
    assert result.report.unmapped == []
    nodes = result.graph.model_dump()["nodes"]
    empty = next(n for n in nodes.values() if n["type"] == "image/empty")
    assert (empty["params"]["color"], set(empty["inputs"])) == (0, {"width", "height"})
    assert [n["type"] for n in nodes.values()].count("ltx2/sample") == 2
    outcome, run = render(nodes, result.target)
    assert outcome.status == "succeeded", outcome.error
    [take] = run.takes.all()
    with av.open(io.BytesIO(blob_read(take.sha256)), "r") as mp4:
        stream = mp4.streams.video[0]
        assert (stream.width, stream.height, float(stream.average_rate or 0)) == (SIDE, SIDE, FPS)
        assert len(list(mp4.decode(stream))) == FRAMES
    with av.open(io.BytesIO(blob_read(take.sha256)), "r") as mp4:
        assert mp4.streams.audio, "the clip has its sound track"


def test_an_empty_image_is_its_size_and_colour(make_ctx):
    from workers.runners import RUNNERS

    image = RUNNERS["image/empty"](make_ctx(), {"width": 24, "height": 16, "color": 0x336699},
                                   {})["image"]
    assert (image.mode, image.size) == ("RGB", (24, 16))
    assert image.getpixel((23, 15)) == (0x33, 0x66, 0x99)


def test_an_empty_image_batch_is_refused_naming_the_node():
    from apps.importer.report import ImportInvalid
    from apps.importer.services import comfy_import

    prompt = {"1": {"class_type": "EmptyImage",
                    "inputs": {"width": 64, "height": 64, "batch_size": 2, "color": 0}},
              "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0],
                                                          "filename_prefix": "x"}}}
    with pytest.raises(ImportInvalid) as refused:
        comfy_import(workflow=prompt, catalog={})
    assert "node 1 (EmptyImage)" in str(refused.value)
    assert "batch_size 2: an image here is one image" in str(refused.value)
