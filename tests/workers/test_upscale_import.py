"""A ComfyUI upscale-model pass (LoadImage → UpscaleModelLoader + ImageUpscaleWithModel →
SaveImage), imported from both formats and rendered through the real executor on the real
database with a tiny random ESRGAN in `upscale_models/`."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
from PIL import Image

from apps.importer.services import comfy_import
from tests.apps.importer.builder import Ui
from tests.workers.helpers import noise_image, png_bytes
from tests.workers.vocab_helpers import asset_of, render
from workers.models.upscale.tiny import write_tiny_upscaler

pytestmark = pytest.mark.django_db
MODEL = "RealESRGAN_x4plus.pth"  # the name templates use, held here as a tiny random net


@pytest.fixture(autouse=True)
def _dirs(settings: Any, tmp_path: Any) -> None:
    settings.INLINE_BLOB_DIR = tmp_path / "blobs"
    settings.INLINE_MODELS_DIR = tmp_path / "models"
    write_tiny_upscaler(tmp_path / "models", MODEL, layout="old")


def api_workflow() -> dict[str, Any]:
    return {
        "1": {"class_type": "LoadImage", "inputs": {"image": "plate.png"}},
        "2": {"class_type": "UpscaleModelLoader", "inputs": {"model_name": MODEL}},
        "3": {"class_type": "ImageUpscaleWithModel",
              "inputs": {"upscale_model": ["2", 0], "image": ["1", 0]}},
        "4": {"class_type": "SaveImage", "inputs": {"images": ["3", 0], "filename_prefix": "up"}},
    }


def ui_workflow() -> dict[str, Any]:
    ui = Ui()
    ui.add(1, "LoadImage", ["plate.png", "image"], outputs=["IMAGE", "MASK"])
    ui.add(2, "UpscaleModelLoader", [MODEL], outputs=["UPSCALE_MODEL"])
    ui.add(3, "ImageUpscaleWithModel", [], inputs=[("upscale_model", "UPSCALE_MODEL"),
                                                   ("image", "IMAGE")], outputs=["IMAGE"])
    ui.add(4, "SaveImage", ["up"], inputs=[("images", "IMAGE")])
    return ui.link(2, 0, 3, "upscale_model").link(1, 0, 3, "image").link(3, 0, 4, "images").doc()


def test_an_upscale_model_pass_imports_from_both_formats_and_renders_four_times_bigger():
    plate = noise_image(24, 16, seed=11)
    asset = asset_of(plate)
    results = [comfy_import(workflow=doc, catalog={"upscale_models": [MODEL]},
                            resolve_asset=lambda name: asset if name == "plate.png" else None)
               for doc in (api_workflow(), ui_workflow())]
    api, ui = results
    assert api.graph == ui.graph and api.target == ui.target == "4"
    for result in results:
        assert result.report.warnings == [] and result.report.unmapped == []
        assert result.report.models == [{"id": "2", "type": "UpscaleModelLoader",
                                         "folder": "upscale_models", "name": MODEL, "held": True}]
    nodes = api.graph.model_dump()["nodes"]
    assert nodes["2"] == {"type": "load/upscale-model", "params": {"file": MODEL}, "inputs": {}}
    assert nodes["3"]["type"] == "image/upscale-with-model"

    outcome, run = render(nodes, "4")
    assert outcome.status == "succeeded", outcome.error
    [take] = run.takes.all()
    from apps.takes.storage import blob_read

    image = Image.open(io.BytesIO(blob_read(take.sha256)))
    assert image.size == (96, 64) == (take.width, take.height)
    assert f"upscale_models/{MODEL}" in take.lineage["models"]
    assert np.asarray(image).std() > 0  # the net's output, not a blank canvas


def test_a_file_of_another_architecture_fails_the_run_naming_it(tmp_path):
    import torch
    from safetensors.torch import save_file

    save_file({"decoder.conv_in.weight": torch.zeros(4, 16, 3, 3)},
              str(tmp_path / "models" / "upscale_models" / "vae.safetensors"))
    nodes = {
        "src": {"type": "image/load", "params": {"asset": asset_of(noise_image(8, 8))}},
        "m": {"type": "load/upscale-model", "params": {"file": "vae.safetensors"}},
        "up": {"type": "image/upscale-with-model",
               "inputs": {"upscale_model": {"node": "m", "port": "upscale_model"},
                          "image": {"node": "src", "port": "image"}}},
        "out": {"type": "image/save", "inputs": {"image": {"node": "up", "port": "image"}}},
    }
    outcome, run = render(nodes, "out")
    assert outcome.status == "failed" and run.status == "failed"
    assert outcome.error is not None and outcome.error["nodeId"] == "m"
    assert "vae.safetensors" in outcome.error["message"]
    assert "no upscale architecture" in outcome.error["message"]


def _upscale_graph(model: str, asset: str) -> Any:
    from apps.graphs.schema import GraphDoc

    return GraphDoc.model_validate({"nodes": {
        "m": {"type": "load/upscale-model", "params": {"file": model}},
        "up": {"type": "image/upscale-with-model",
               "inputs": {"upscale_model": {"node": "m", "port": "upscale_model"},
                          "image": {"node": "src", "port": "image"}}},
        "src": {"type": "image/load", "params": {"asset": asset}},
        "out": {"type": "image/save", "inputs": {"image": {"node": "up", "port": "image"}}},
    }})


def test_submit_takes_a_held_upscaler_and_refuses_weights_of_no_known_architecture(tmp_path):
    """The fleet's heartbeat says what each upscale_models/ file is (workers/models/catalog
    `scan`): a safetensors file of no upscale architecture is a 422 naming the node, never a
    worker failure; a .pth says nothing until loaded."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from apps.fleet.models import Worker
    from apps.graphs.validation import GraphInvalid
    from apps.runs.services import run_submit
    from apps.takes.services import asset_create
    from workers.models.catalog import scan

    models = tmp_path / "models"
    (models / "upscale_models" / "odd.safetensors").write_bytes(
        _safetensors_of_another_net())
    write_tiny_upscaler(models, "x4.safetensors")
    Worker.objects.create(name="cpu@host", queues=["cpu"], state="online",
                          last_heartbeat=timezone.now(), slots=2, device={"profile": "cpu"},
                          model_files=scan(models))
    artist = get_user_model().objects.create(username="artist")
    asset = str(asset_create(owner=artist, data=png_bytes(noise_image(8, 8)))[0].pk)
    for held in ("x4.safetensors", MODEL):
        _, created = run_submit(owner=artist, target="out", graph=_upscale_graph(held, asset))
        assert created
    with pytest.raises(GraphInvalid) as refused:
        run_submit(owner=artist, target="out", graph=_upscale_graph("odd.safetensors", asset))
    assert (refused.value.code, refused.value.node_id) == ("unsupported_upscaler", "m")
    assert "upscale_models/odd.safetensors" in refused.value.message


def _safetensors_of_another_net() -> bytes:
    import json
    import struct

    header = json.dumps({"decoder.conv_in.weight": {"dtype": "F32", "shape": [1],
                                                    "data_offsets": [0, 4]}}).encode()
    return struct.pack("<Q", len(header)) + header + b"\0\0\0\0"


def test_object_info_describes_the_upscale_nodes_as_comfyui_does():
    from apps.importer.comfy_object_info import object_info

    info = object_info(catalog={"upscale_models": [MODEL]}, uploads=[])
    assert info["UpscaleModelLoader"]["input"]["required"] == {"model_name": [[MODEL], {}]}
    assert info["UpscaleModelLoader"]["output"] == ["UPSCALE_MODEL"]
    assert info["ImageUpscaleWithModel"]["input"]["required"] == {
        "upscale_model": ["UPSCALE_MODEL"], "image": ["IMAGE"]}


def test_comfyuis_shipped_gan_video_upscaler_imports_and_upscales_every_frame(tmp_path):
    """`utility-gan_upscaler`: LoadVideo → GetVideoComponents → ImageUpscaleWithModel of the
    clip's frames → CreateVideo → SaveVideo; the frames go through frames/upscale-with-model,
    each the image node's upscale of that frame."""
    import json

    import av

    from apps.importer.comfy_templates import shipped_file
    from apps.takes.services import asset_create
    from apps.takes.storage import blob_read
    from tests.workers.test_video import smooth_frames, tone
    from workers.models.values import Frames, Video
    from workers.video import video_write

    clip = tmp_path / "gan_input.mp4"
    video_write(Video(Frames(smooth_frames(count=4)), 12.0, tone(0.3)), clip, format="mp4",
                crf=30, comment="{}")
    from django.contrib.auth import get_user_model

    owner, _ = get_user_model().objects.get_or_create(username="vocab-owner")
    asset, _ = asset_create(owner=owner, data=clip.read_bytes())
    workflow = json.loads(shipped_file("utility-gan_upscaler.json") or b"{}")
    [loader] = [n for n in workflow["nodes"] if n["type"] == "UpscaleModelLoader"]
    loader["widgets_values"] = [MODEL]
    result = comfy_import(workflow=workflow, catalog={"upscale_models": [MODEL]},
                          resolve_asset=lambda name: str(asset.pk) if name == "gan_input.mp4"
                          else None)
    assert result.report.unmapped == []
    nodes = result.graph.model_dump()["nodes"]
    assert nodes["2"]["type"] == "frames/upscale-with-model"
    assert nodes["2"]["inputs"]["frames"] == {"node": "10", "port": "frames"}
    outcome, run = render(nodes, result.target)
    assert outcome.status == "succeeded", outcome.error
    [take] = run.takes.all()
    with av.open(io.BytesIO(blob_read(take.sha256)), "r") as mp4:
        stream = mp4.streams.video[0]
        assert (stream.width, stream.height) == (64 * 4, 48 * 4)
        assert len(list(mp4.decode(stream))) == 4
    with av.open(io.BytesIO(blob_read(take.sha256)), "r") as mp4:
        assert mp4.streams.audio, "the clip keeps its sound"
