"""The importer's mappings of ComfyUI's video nodes (comfy_extras/nodes_video.py and
SaveAnimatedWEBP): LoadVideo, GetVideoComponents, CreateVideo, SaveVideo's format and codec
widgets, in both formats; what it cannot honour is a warning (no database)."""

from __future__ import annotations

from typing import Any

import pytest

from apps.importer.services import comfy_import
from tests.apps.importer.builder import CATALOG, Ui


def _ref(node: str, port: str) -> dict[str, str]:
    return {"node": node, "port": port}


def remux_prompt(fmt: str = "auto", codec: str = "auto") -> dict[str, Any]:
    return {
        "1": {"class_type": "LoadVideo", "inputs": {"file": "clip.mp4"}},
        "2": {"class_type": "GetVideoComponents", "inputs": {"video": ["1", 0]}},
        "3": {"class_type": "CreateVideo", "inputs": {
            "images": ["2", 0], "audio": ["2", 1], "fps": ["2", 2]}},
        "4": {"class_type": "SaveVideo", "inputs": {
            "video": ["3", 0], "filename_prefix": "video/take", "format": fmt, "codec": codec}},
        "5": {"class_type": "SaveAnimatedWEBP", "inputs": {
            "images": ["2", 0], "filename_prefix": "anim", "fps": 8.0, "lossless": False,
            "quality": 70, "method": "default"}},
    }


def test_a_load_split_create_save_workflow_maps_node_for_node_with_the_upload_resolved():
    result = comfy_import(workflow=remux_prompt(), catalog=CATALOG,
                          resolve_asset=lambda name: "asset-of-" + name)
    graph = result.graph.model_dump()["nodes"]
    assert result.target == "4"
    assert graph["1"] == {"type": "video/load", "params": {"asset": "asset-of-clip.mp4"},
                          "inputs": {}}
    assert graph["2"] == {"type": "video/components", "params": {},
                          "inputs": {"video": _ref("1", "video")}}
    assert graph["3"]["type"] == "video/create" and graph["3"]["inputs"] == {
        "frames": _ref("2", "frames"), "audio": _ref("2", "audio"), "fps": _ref("2", "fps")}
    assert graph["4"] == {"type": "video/save",
                          "params": {"label": "video/take", "format": "mp4", "crf": 19},
                          "inputs": {"video": _ref("3", "video")}}
    # the second output is not the target, so it is not kept; import it alone to see its params
    assert result.report.warnings == []


def test_save_animated_webp_keeps_its_widgets():
    prompt = {k: v for k, v in remux_prompt().items() if k != "4"}
    del prompt["3"]
    graph = comfy_import(workflow=prompt, catalog=CATALOG,
                         resolve_asset=lambda name: "a1").graph.model_dump()["nodes"]
    assert graph["5"] == {"type": "image/save-animated-webp",
                          "params": {"label": "anim", "fps": 8.0, "lossless": False,
                                     "quality": 70},
                          "inputs": {"frames": _ref("2", "frames")}}


@pytest.mark.parametrize(("fmt", "codec", "ours", "warned"), [
    ("mp4", "h264", "mp4", []),
    ("webm", "vp9", "webm", []),
    ("auto", "av1", "webm", ["codec 'av1' is kept as VP9 in WebM (the farm encodes H.264 and VP9)"]),
    ("mkv", "auto", "mp4", ["format 'mkv' is kept as mp4 (the farm writes MP4 and WebM)"]),
])
def test_save_video_format_and_codec_pick_mp4_or_webm(fmt, codec, ours, warned):
    result = comfy_import(workflow=remux_prompt(fmt, codec), catalog=CATALOG,
                          resolve_asset=lambda name: "a1")
    assert result.graph.model_dump()["nodes"]["4"]["params"]["format"] == ours
    assert [w["message"] for w in result.report.warnings if w["id"] == "4"] == warned


def test_the_ui_format_reads_the_video_widgets_in_order():
    ui = (Ui()
          .add(1, "LoadVideo", ["clip.webm", "image"], outputs=["VIDEO"])
          .add(2, "GetVideoComponents", inputs=[("video", "VIDEO")],
               outputs=["IMAGE", "AUDIO", "FLOAT"])
          .add(3, "CreateVideo", [12], inputs=[("images", "IMAGE"), ("audio", "AUDIO")],
               outputs=["VIDEO"])
          .add(4, "SaveVideo", ["clips/x", "webm", "vp9"], inputs=[("video", "VIDEO")])
          .link(1, 0, 2, "video").link(2, 0, 3, "images").link(2, 1, 3, "audio")
          .link(3, 0, 4, "video"))
    result = comfy_import(workflow=ui.doc(), catalog=CATALOG, resolve_asset=lambda name: "a9")
    graph = result.graph.model_dump()["nodes"]
    assert graph["1"]["params"] == {"asset": "a9"}
    assert graph["3"]["params"] == {"fps": 12.0}
    assert graph["4"]["params"] == {"label": "clips/x", "format": "webm", "crf": 19}


def test_object_info_describes_the_video_nodes_as_comfyui_does():
    from apps.importer.comfy_object_info import object_info

    info = object_info(catalog={}, uploads=["clip.mp4", "cat.png"])
    create = info["CreateVideo"]["input"]
    assert create["required"]["images"] == ["IMAGE"] and create["optional"] == {"audio": ["AUDIO"]}
    assert create["required"]["fps"][0] == "FLOAT" and create["required"]["fps"][1]["default"] == 30
    assert info["LoadVideo"]["input"]["required"]["file"] == [["clip.mp4"], {"video_upload": True}]
    assert info["LoadImage"]["input"]["required"]["image"][0] == ["cat.png"]
    save = info["SaveVideo"]
    assert save["output_node"] and save["input"]["required"]["codec"][0] == ["auto", "h264", "vp9"]
    assert info["GetVideoComponents"]["output"] == ["IMAGE", "AUDIO", "FLOAT"]
    assert info["SaveAnimatedWEBP"]["output_node"]


def test_batch_images_of_clips_maps_to_frames_batch_in_slot_order():
    """ComfyUI's shipped `templates-6-key-frames`: five Wan 2.2 first-last-frame segments'
    decoded frames joined by BatchImagesNode, then CreateVideo."""
    import json

    from apps.importer.comfy_templates import shipped_file

    workflow = json.loads(shipped_file("templates-6-key-frames.json") or b"{}")
    result = comfy_import(workflow=workflow, catalog={})
    nodes = result.graph.model_dump()["nodes"]
    batch = nodes["281"]
    assert batch["type"] == "frames/batch"
    sources = [batch["inputs"][p]["node"].split(":")[0]
               for p in ("frames", "frames2", "frames3", "frames4", "frames5")]
    assert sources == ["140", "228", "245", "262", "279"]  # the segments, in slot order
    assert nodes[batch["inputs"]["frames"]["node"]]["type"] == "vae/decode-video"
    assert "frames6" not in batch["inputs"]  # images.image5: unwired
    assert nodes["145"]["inputs"]["frames"] == {"node": "281", "port": "frames"}


def test_a_batch_of_more_inputs_than_frames_batch_takes_is_refused_by_name():
    from apps.importer.report import ImportInvalid

    prompt: dict[str, Any] = {str(i): {"class_type": "LoadImage", "inputs": {"image": "a.png"}}
                              for i in range(1, 18)}
    prompt["20"] = {"class_type": "BatchImagesNode",
                    "inputs": {f"images.image{i}": [str(i + 1), 0] for i in range(17)}}
    prompt["21"] = {"class_type": "SaveAnimatedWEBP", "inputs": {
        "images": ["20", 0], "filename_prefix": "anim", "fps": 8.0, "lossless": False,
        "quality": 70, "method": "default"}}
    with pytest.raises(ImportInvalid, match=r"images\.image16: frames/batch takes at most 16"):
        comfy_import(workflow=prompt, catalog={}, resolve_asset=lambda name: "asset-1")
