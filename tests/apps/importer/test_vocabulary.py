"""The importer's mappings of ComfyUI's core vocabulary (values, math, switch, previews, image
ops, SaveImageAdvanced), in both formats and inside subgraphs; what it cannot honour is in
`warnings` or `unmapped` with the reason (no database)."""

from __future__ import annotations

from typing import Any

import pytest

from apps.importer.services import comfy_import
from tests.apps.importer.builder import CATALOG, Ui, switch_api, switch_ui


def imported(doc: Any) -> Any:
    return comfy_import(workflow=doc, catalog=CATALOG)


def nodes(result: Any) -> dict[str, Any]:
    return result.graph.model_dump()["nodes"]


def messages(result: Any, node_id: str) -> list[str]:
    return [w["message"] for w in result.report.warnings if w["id"] == node_id]


def test_a_switch_in_a_subgraph_and_a_math_derived_size_import_alike_from_both_formats():
    ui, api = imported(switch_ui().doc()), imported(switch_api())
    assert ui.graph == api.graph and ui.target == api.target == "10"
    graph = nodes(ui)
    # The PrimitiveBoolean (13) fixes the switch: settled at import, as ComfyUI runs only
    # the chosen branch (ImageScaleBy); a switch decided at run time stays one (test_shipped_…).
    assert "20:3" not in graph and "20:2" not in graph and "13" not in graph
    assert graph["10"]["inputs"]["image"] == {"node": "20:1", "port": "image"}
    assert any(d["id"] == "20:3" and "its switch is True" in d["reason"]
               for d in ui.report.dropped)
    assert graph["7"]["inputs"] == {"width": {"node": "12", "port": "int"}}
    assert graph["12"]["inputs"] == {"a": {"node": "11", "port": "value"}}
    assert graph["20:1"]["params"] == {"scale_by": 0.5, "method": "nearest"}
    assert graph["21"] == {"type": "util/preview", "params": {},
                           "inputs": {"source": {"node": "12", "port": "int"}}}
    assert ui.report.warnings == [] and ui.report.unmapped == []


def _one(comfy_type: str, inputs: dict[str, Any], source_kind: str = "IMAGE") -> Any:
    """LoadImage → `comfy_type` → SaveImage, API format (a mask-producing type feeds
    MaskToImage first)."""
    prompt = {
        "1": {"class_type": "LoadImage", "inputs": {"image": "cat.png"}},
        "2": {"class_type": comfy_type, "inputs": {"image": ["1", 0], **inputs}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "x"}},
    }
    return imported(prompt)


@pytest.mark.parametrize(("comfy", "inputs", "ours", "params"), [
    ("ImageScaleBy", {"upscale_method": "area", "scale_by": 1.5}, "image/scale-by",
     {"scale_by": 1.5, "method": "bilinear"}),
    ("ImageScaleToTotalPixels", {"upscale_method": "lanczos", "megapixels": 0.5,
                                 "resolution_steps": 8}, "image/scale-to-pixels",
     {"megapixels": 0.5, "resolution_steps": 8, "method": "lanczos"}),
    ("ImageScale", {"upscale_method": "bicubic", "width": 0, "height": 300, "crop": "disabled"},
     "image/scale-side", {"side": "height", "size": 300, "method": "bicubic"}),
    ("ImageScale", {"upscale_method": "bicubic", "width": 320, "height": 200, "crop": "center"},
     "image/resize", {"width": 320, "height": 200, "method": "bicubic", "fit": "crop",
                      "pad_color": "black"}),
    ("ImageInvert", {}, "image/invert", {}),
    ("ResizeAndPadImage", {"target_width": 512, "target_height": 512, "padding_color": "white",
                           "interpolation": "lanczos"}, "image/resize",
     {"width": 512, "height": 512, "method": "lanczos", "fit": "pad", "pad_color": "white"}),
    ("ImagePadForOutpaint", {"left": 64, "top": 0, "right": 64, "bottom": 0, "feathering": 24},
     "image/pad-outpaint", {"left": 64, "top": 0, "right": 64, "bottom": 0, "feathering": 24}),
])
def test_image_ops_map_with_their_widgets(comfy, inputs, ours, params):
    graph = nodes(_one(comfy, inputs))
    assert graph["2"]["type"] == ours and graph["2"]["params"] == params


@pytest.mark.parametrize(("resize_type", "extra", "ours", "params"), [
    ("scale dimensions", {"resize_type.width": 320, "resize_type.height": 240,
                          "resize_type.crop": "center"}, "image/resize",
     {"width": 320, "height": 240, "method": "lanczos", "fit": "crop", "pad_color": "black"}),
    ("scale by multiplier", {"resize_type.multiplier": 2.0}, "image/scale-by",
     {"scale_by": 2.0, "method": "lanczos"}),
    ("scale longer dimension", {"resize_type.longer_size": 768}, "image/scale-side",
     {"side": "longer", "size": 768, "method": "lanczos"}),
    ("scale total pixels", {"resize_type.megapixels": 1.0}, "image/scale-to-pixels",
     {"megapixels": 1.0, "resolution_steps": 1, "method": "lanczos"}),
    ("scale to multiple", {"resize_type.multiple": 64}, "image/scale-to-multiple",
     {"multiple": 64, "method": "lanczos"}),
])
def test_resize_image_mask_node_modes_map_to_our_image_nodes(resize_type, extra, ours, params):
    prompt = {
        "1": {"class_type": "LoadImage", "inputs": {"image": "cat.png"}},
        "2": {"class_type": "ResizeImageMaskNode", "inputs": {
            "input": ["1", 0], "resize_type": resize_type, "scale_method": "lanczos", **extra}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0]}},
    }
    graph = nodes(imported(prompt))
    assert graph["2"]["type"] == ours and graph["2"]["params"] == params


def test_resize_image_mask_node_reads_its_dynamic_widgets_from_the_ui_format():
    ui = Ui()
    ui.add(1, "LoadImage", ["cat.png", "image"], outputs=["IMAGE", "MASK"])
    ui.add(2, "ResizeImageMaskNode", ["scale dimensions", 320, 240, "disabled", "bicubic"],
           inputs=[("input", "IMAGE")], outputs=["IMAGE"])
    ui.add(3, "SaveImage", ["x"], inputs=[("images", "IMAGE")])
    ui.link(1, 0, 2, "input").link(2, 0, 3, "images")
    assert nodes(imported(ui.doc()))["2"]["params"] == {
        "width": 320, "height": 240, "method": "bicubic", "fit": "stretch", "pad_color": "black"}


def test_match_size_resizes_to_the_size_of_an_image_or_mask_from_both_formats():
    prompt: dict[str, Any] = {
        "1": {"class_type": "LoadImage", "inputs": {"image": "cat.png"}},
        "2": {"class_type": "ResizeImageMaskNode", "inputs": {
            "input": ["1", 0], "resize_type": "match size", "resize_type.match": ["1", 1],
            "resize_type.crop": "disabled", "scale_method": "area"}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "x"}},
    }
    ui = Ui()
    ui.add(1, "LoadImage", ["cat.png", "image"], outputs=["IMAGE", "MASK"])
    ui.add(2, "ResizeImageMaskNode", ["match size", "disabled", "area"],
           inputs=[("input", "IMAGE"), ("resize_type.match", "IMAGE,MASK")], outputs=["IMAGE"])
    ui.add(3, "SaveImage", ["x"], inputs=[("images", "IMAGE")])
    ui.link(1, 0, 2, "input").link(1, 1, 2, "resize_type.match").link(2, 0, 3, "images")
    api, from_ui = imported(prompt), imported(ui.doc())
    assert api.graph == from_ui.graph
    assert nodes(api)["2"] == {
        "type": "image/resize-to-match", "params": {"method": "bilinear", "fit": "stretch"},
        "inputs": {"image": {"node": "1", "port": "image"}, "match": {"node": "1", "port": "mask"}}}
    assert messages(api, "2") == ["upscale_method 'area' is approximated by 'bilinear'"]
    del prompt["2"]["inputs"]["resize_type.crop"]  # ComfyUI's default: center
    assert nodes(imported(prompt))["2"]["params"]["fit"] == "crop"


def test_a_resize_mode_the_farm_lacks_is_unmapped_with_its_reason():
    prompt = {
        "1": {"class_type": "LoadImage", "inputs": {"image": "cat.png"}},
        "2": {"class_type": "ResizeImageMaskNode", "inputs": {
            "input": ["1", 0], "resize_type": "scale to fit the moon", "scale_method": "area"}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["1", 0]}},
        "4": {"class_type": "SaveImage", "inputs": {"images": ["2", 0]}},
    }
    result = imported(prompt)
    [unmapped] = result.report.unmapped
    assert unmapped["id"] == "2" and "scale to fit the moon" in unmapped["reason"]
    assert result.target == "3"


def test_masks_flow_from_image_to_mask_into_a_composite():
    prompt = {
        "1": {"class_type": "LoadImage", "inputs": {"image": "cat.png"}},
        "2": {"class_type": "ImageToMask", "inputs": {"image": ["1", 0], "channel": "green"}},
        "3": {"class_type": "ImageCompositeMasked", "inputs": {
            "destination": ["1", 0], "source": ["1", 0], "mask": ["2", 0], "x": 8, "y": 16,
            "resize_source": False}},
        "4": {"class_type": "SaveImage", "inputs": {"images": ["3", 0]}},
    }
    graph = nodes(imported(prompt))
    assert graph["2"] == {"type": "mask/from-image", "params": {"channel": "green"},
                          "inputs": {"image": {"node": "1", "port": "image"}}}
    assert graph["3"]["inputs"]["mask"] == {"node": "2", "port": "mask"}
    assert graph["3"]["params"] == {"x": 8, "y": 16, "resize_source": False}


@pytest.mark.parametrize(("fmt", "ours", "warned"), [
    ("png", "png", []), ("webp", "webp", []),
    ("avif", "png", ["format 'avif' is not on this farm: the take is a PNG",
                     "bit_depth '10-bit YUV420' is ignored: takes are 8 bits per channel"]),
])
def test_save_image_advanced_keeps_its_format_or_warns(fmt, ours, warned):
    prompt = {
        "1": {"class_type": "LoadImage", "inputs": {"image": "cat.png"}},
        "2": {"class_type": "SaveImageAdvanced", "inputs": {
            "images": ["1", 0], "filename_prefix": "shot", "format": fmt,
            "format.bit_depth": "10-bit YUV420" if fmt == "avif" else "8-bit"}},
    }
    result = imported(prompt)
    assert nodes(result)["2"]["params"] == {"label": "shot", "format": ours, "quality": 90}
    assert messages(result, "2") == warned


def test_values_strings_and_resolution_presets_map_and_a_preview_alone_is_the_target():
    prompt = {
        "1": {"class_type": "ResolutionSelector", "inputs": {
            "aspect_ratio": "3:2 (Photo)", "megapixels": 1.0, "multiple": 16, "minimum": 256}},
        "2": {"class_type": "PrimitiveStringMultiline", "inputs": {"value": "a\nb"}},
        "3": {"class_type": "StringConcatenate", "inputs": {
            "string_a": ["2", 0], "string_b": "c", "delimiter": " "}},
        "4": {"class_type": "PreviewAny", "inputs": {"source": ["3", 0]}},
        "5": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
    }
    result = imported(prompt)
    graph = nodes(result)
    assert result.target == "4" and graph["3"]["inputs"] == {"string_a": {"node": "2",
                                                                          "port": "text"}}
    assert graph["3"]["params"]["string_b"] == "c" and "5" not in graph
    assert "does not compute" in next(d for d in result.report.dropped if d["id"] == "5")["reason"]


def test_a_preview_of_what_the_farm_does_not_show_is_unmapped():
    prompt = {
        "1": {"class_type": "LoadImage", "inputs": {"image": "cat.png"}},
        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["1", 0]}},
    }
    result = imported(prompt)
    [unmapped] = result.report.unmapped
    assert unmapped["id"] == "2" and "previews image values" in unmapped["reason"]


def test_a_math_input_given_as_a_number_is_a_warning():
    prompt = {
        "1": {"class_type": "ComfyMathExpression", "inputs": {"expression": "a + 1",
                                                              "values.a": ["2", 0], "b": 3}},
        "2": {"class_type": "PrimitiveFloat", "inputs": {"value": 1.5}},
        "3": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
    }
    result = imported(prompt)
    assert nodes(result)["1"]["inputs"] == {"a": {"node": "2", "port": "value"}}
    assert messages(result, "1") == ["input 'b' holds the value 3, not a link: feed it from a "
                                     "PrimitiveFloat / PrimitiveInt node (the farm reads inputs "
                                     "only)"]


def test_object_info_describes_the_new_types_as_comfyui_does():
    from apps.importer.comfy_object_info import object_info

    info = object_info(catalog={}, uploads=[])
    switch, math, preview = (info[t] for t in ("ComfySwitchNode", "ComfyMathExpression",
                                               "PreviewAny"))
    assert switch["input"]["required"] == {"switch": ["BOOLEAN"]}
    assert switch["input"]["optional"] == {"on_false": ["*"], "on_true": ["*"]}
    assert switch["output"] == ["*"]
    assert list(math["input"]["required"]) == ["expression"]
    assert len(math["input"]["optional"]) == 26 and math["output"] == ["FLOAT", "INT", "BOOLEAN"]
    assert preview["input"]["required"] == {"source": ["*"]} and preview["output_node"]
    assert info["LoadImage"]["output"] == ["IMAGE", "MASK"]
    assert info["PrimitiveBoolean"]["output"] == ["BOOLEAN"]


def test_get_image_size_feeds_a_converted_crop_widget():
    prompt = {
        "1": {"class_type": "LoadImage", "inputs": {"image": "cat.png"}},
        "2": {"class_type": "GetImageSize", "inputs": {"image": ["1", 0]}},
        "3": {"class_type": "ImageCrop", "inputs": {"image": ["1", 0], "width": ["2", 0],
                                                    "height": ["2", 1], "x": 0, "y": 0}},
        "4": {"class_type": "SaveImage", "inputs": {"images": ["3", 0]}},
    }
    result = imported(prompt)
    assert nodes(result)["3"]["inputs"] == {"image": {"node": "1", "port": "image"},
                                            "width": {"node": "2", "port": "width"},
                                            "height": {"node": "2", "port": "height"}}
    assert result.report.warnings == [] or all("loads 'cat.png'" in w["message"]
                                               for w in result.report.warnings)
