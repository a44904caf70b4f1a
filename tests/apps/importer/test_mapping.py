"""The importer's mapping rules, one by one, on workflows in both ComfyUI formats (no database)."""

from __future__ import annotations

from typing import Any

import pytest

from apps.importer.api_format import model_resolve
from apps.importer.report import ImportInvalid
from apps.importer.services import comfy_import, workflow_parse
from tests.apps.importer.builder import CATALOG, Ui, turbo_ui, workflow


def imported(doc: Any, catalog: dict[str, list[str]] | None = None) -> Any:
    return comfy_import(workflow=doc, catalog=CATALOG if catalog is None else catalog)


def refused(doc: Any) -> ImportInvalid:
    with pytest.raises(ImportInvalid) as err:
        imported(doc)
    return err.value


def nodes(result: Any) -> dict[str, Any]:
    return result.graph.model_dump()["nodes"]


def entry(entries: list[dict[str, Any]], node_id: str) -> dict[str, Any]:
    return next(e for e in entries if e["id"] == node_id)


# --- the official Z-Image Turbo workflow ------------------------------------------------------


def test_both_formats_of_the_z_image_turbo_workflow_import_to_the_same_graph():
    ui = imported(workflow("z_image_turbo.ui.json"))
    api = imported(workflow("z_image_turbo.api.json"))
    assert ui.graph == api.graph and ui.target == api.target == "9"
    assert ui.report.format == "ui" and api.report.format == "api"
    graph = nodes(ui)
    assert graph["57:3"]["type"] == "sample"
    assert graph["57:3"]["params"] == {"seed": 42, "steps": 8, "guidance": 0.0, "denoise": 1.0,
                                       "shift": 3.0, "parallel": "auto",
                                           "sampler": "res_multistep",
                                       "scheduler": "simple"}  # ModelSamplingAuraFlow
    assert graph["57:3"]["inputs"]["model"] == {"node": "57:28", "port": "model"}
    assert "negative" not in graph["57:3"]["inputs"]
    assert graph["57:30"]["params"] == {"file": "qwen_3_4b", "file_2": None,  # the folder model
                                        "family": "zimage"}  # `type` lumina2
    assert graph["9"] == {"type": "image/save", "params": {"label": "z-image-turbo",
                                                           "format": "png", "quality": 90},
                          "inputs": {"image": {"node": "57:8", "port": "image"}}}


def test_the_report_lists_every_node_once_with_its_reason():
    result = imported(workflow("z_image_turbo.ui.json")).report.to_wire()
    ids = [e["id"] for key in ("mapped", "dropped", "unmapped") for e in result[key]]
    assert sorted(ids) == sorted(["35", "9", "57", "57:28", "57:30", "57:29", "57:11", "57:27",
                                  "57:33", "57:13", "57:3", "57:8"])
    assert entry(result["dropped"], "35") == {"id": "35", "type": "MarkdownNote",
                                              "reason": "a note: UI only"}
    assert "flattened" in entry(result["dropped"], "57")["reason"]
    assert entry(result["mapped"], "57:11") == {"id": "57:11", "type": "ModelSamplingAuraFlow",
                                                "as": "sample", "into": ["57:3"], "param": "shift"}
    assert "negative" in entry(result["dropped"], "57:33")["reason"]
    assert not [w for w in result["warnings"] if w["id"] == "57:3"]  # res_multistep is honoured


def test_a_model_the_fleet_does_not_hold_is_reported_with_its_folder():
    result = imported(workflow("z_image_turbo.api.json"), catalog={})
    models = result.report.to_wire()["models"]
    assert entry(models, "57:28") == {"id": "57:28", "type": "UNETLoader",
                                      "folder": "diffusion_models",
                                      "name": "z_image_turbo_bf16.safetensors", "held": False}
    warning = entry(result.report.warnings, "57:28")["message"]
    assert "diffusion_models/" in warning and "z_image_turbo_bf16.safetensors" in warning


def test_model_names_resolve_against_the_catalog():
    held = ["zimage/ae.safetensors", "qwen_3_4b", "flux.safetensors"]
    assert model_resolve("qwen_3_4b.safetensors", held) == ("qwen_3_4b", True)
    assert model_resolve("zimage\\ae.safetensors", held) == ("zimage/ae.safetensors", True)
    assert model_resolve("ae.safetensors", held) == ("zimage/ae.safetensors", True)
    assert model_resolve("flux.sft", held) == ("flux.safetensors", True)
    assert model_resolve("missing.safetensors", held) == ("missing.safetensors", False)


# --- positional widgets -----------------------------------------------------------------------


def test_widgets_follow_the_real_order_skipping_control_after_generate():
    graph = nodes(imported(turbo_ui(ksampler=[7, "fixed", 5, 3.5, "euler", "simple", 0.5]).doc()))
    assert graph["8"]["params"] == {"seed": 7, "steps": 10, "guidance": 2.5, "denoise": 0.5,
                                    "shift": 3.0, "parallel": "auto",
        "sampler": "euler",
                                       "scheduler": "simple"}  # ComfyUI's denoise
    assert graph["7"]["params"] == {"width": 512, "height": 384}


def test_a_save_without_the_control_value_reads_the_same():
    graph = nodes(imported(turbo_ui(ksampler=[7, 5, 3.5, "euler", "simple", 0.5]).doc()))
    assert graph["8"]["params"] == {"seed": 7, "steps": 10, "guidance": 2.5, "denoise": 0.5,
                                    "shift": 3.0, "parallel": "auto",
        "sampler": "euler",
                                       "scheduler": "simple"}  # ComfyUI's denoise


def test_a_converted_widget_keeps_its_slot_and_takes_the_linked_value():
    ui = turbo_ui(ksampler=[7, "increment", 5, 1, "euler", "simple", 1])
    ui.add(20, "PrimitiveNode", [1234, "fixed"], outputs=["INT"]).link(20, 0, 8, "seed")
    result = imported(ui.doc())
    assert nodes(result)["8"]["params"]["seed"] == 1234
    assert nodes(result)["8"]["params"]["steps"] == 5  # the seed's slot is still counted
    assert "1234" in entry(result.report.dropped, "20")["reason"]


def test_a_converted_widget_fed_by_a_real_node_is_wired_to_our_port():
    ui = turbo_ui()
    ui.add(20, "PrimitiveInt", [99, "fixed"], outputs=["INT"]).link(20, 0, 8, "seed")
    ui.add(21, "PrimitiveStringMultiline", ["a heron"], outputs=["STRING"])
    ui.link(21, 0, 5, "text")
    graph = nodes(imported(ui.doc()))
    assert graph["20"] == {"type": "input/int", "params": {"value": 99}, "inputs": {}}
    assert graph["8"]["inputs"]["seed"] == {"node": "20", "port": "value"}
    assert graph["5"]["inputs"]["text"] == {"node": "21", "port": "text"}


# --- modes, reroutes, subgraphs ---------------------------------------------------------------


def test_a_muted_output_is_dropped():
    ui = turbo_ui()
    ui.add(11, "SaveImage", ["copy"], inputs=[("images", "IMAGE")], mode=2).link(9, 0, 11, "images")
    result = imported(ui.doc())
    assert "11" not in nodes(result)
    assert entry(result.report.dropped, "11") == {
        "id": "11", "type": "SaveImage", "reason": "muted (mode 2): ComfyUI does not run it"}


def test_a_muted_node_on_the_path_leaves_its_consumer_unwired():
    ui = turbo_ui()
    ui.node(9)["mode"] = 2
    err = refused(ui.doc())
    assert (err.code, err.node_id) == ("missing_input", "10") and err.report is not None
    assert entry(err.report.dropped, "9")["reason"].startswith("muted")


def test_a_bypassed_node_is_removed_and_its_consumers_rewired_to_the_matching_input():
    ui = turbo_ui()
    ui.add(12, "LoraLoaderModelOnly", ["style.safetensors", 0.8], inputs=[("model", "MODEL")],
           outputs=["MODEL"], mode=4)
    ui.link(1, 0, 12, "model").rewire(12, 0, 4, "model")
    result = imported(ui.doc())
    assert nodes(result)["8"]["inputs"]["model"] == {"node": "1", "port": "model"}
    assert entry(result.report.dropped, "12")["reason"].startswith("bypassed (mode 4)")


def test_bypass_picks_the_input_of_the_consumers_type():
    ui = Ui()
    ui.add(1, "LoadImage", ["cat.png", "image"], outputs=["IMAGE", "MASK"])
    ui.add(2, "VAELoader", ["ae.safetensors"], outputs=["VAE"])
    ui.add(3, "VAEEncode", [], inputs=[("pixels", "IMAGE"), ("vae", "VAE")], outputs=["LATENT"],
           mode=4)
    ui.add(4, "SaveImage", ["x"], inputs=[("images", "IMAGE")])
    ui.link(1, 0, 3, "pixels").link(2, 0, 3, "vae").link(3, 0, 4, "images")
    graph = nodes(imported(ui.doc()))
    assert graph["4"]["inputs"]["image"] == {"node": "1", "port": "image"}


def test_reroutes_are_joined():
    ui = turbo_ui()
    ui.add(30, "Reroute", [], inputs=[("", "*")], outputs=["MODEL"])
    ui.add(31, "Reroute", [], inputs=[("", "*")], outputs=["MODEL"])
    ui.link(1, 0, 30, "").link(30, 0, 31, "").rewire(31, 0, 4, "model")
    result = imported(ui.doc())
    assert nodes(result)["8"]["inputs"]["model"] == {"node": "1", "port": "model"}
    assert {e["id"] for e in result.report.dropped} >= {"30", "31"}


def test_a_subgraph_is_flattened_with_its_links_across_the_boundary():
    ui = turbo_ui()
    ui.subgraphs.append({
        "id": "decode-sub", "name": "Decode",
        "inputs": [{"name": "samples", "type": "LATENT"}, {"name": "vae", "type": "VAE"}],
        "outputs": [{"name": "IMAGE", "type": "IMAGE"}],
        "nodes": [{"id": 5, "type": "VAEDecode", "mode": 0, "widgets_values": [],
                   "inputs": [{"name": "samples", "type": "LATENT", "link": 1},
                              {"name": "vae", "type": "VAE", "link": 2}],
                   "outputs": [{"name": "IMAGE", "type": "IMAGE", "links": [3]}]}],
        "links": [{"id": 1, "origin_id": -10, "origin_slot": 0, "target_id": 5, "target_slot": 0,
                   "type": "LATENT"},
                  {"id": 2, "origin_id": -10, "origin_slot": 1, "target_id": 5, "target_slot": 1,
                   "type": "VAE"},
                  {"id": 3, "origin_id": 5, "origin_slot": 0, "target_id": -20, "target_slot": 0,
                   "type": "IMAGE"}],
    })
    ui.node(9)["type"] = "decode-sub"
    result = imported(ui.doc())
    graph = nodes(result)
    assert graph["9:5"]["inputs"] == {"latent": {"node": "8", "port": "latent"},
                                      "vae": {"node": "3", "port": "vae"}}
    assert graph["10"]["inputs"]["image"] == {"node": "9:5", "port": "image"}
    assert "9" not in graph and "Decode" in entry(result.report.dropped, "9")["reason"]


def test_a_note_is_dropped():
    ui = turbo_ui().add(40, "Note", ["remember the fox"])
    assert entry(imported(ui.doc()).report.dropped, "40")["reason"] == "a note: UI only"


# --- what cannot be imported ------------------------------------------------------------------


def test_an_unknown_node_off_the_main_path_is_reported_and_its_output_dropped():
    ui = turbo_ui()
    ui.add(50, "UltimateSDUpscale", [2.0], inputs=[("image", "IMAGE")], outputs=["IMAGE"])
    ui.add(51, "SaveImage", ["big"], inputs=[("images", "IMAGE")])
    ui.link(9, 0, 50, "image").link(50, 0, 51, "images")
    result = imported(ui.doc())
    assert result.target == "10" and "51" not in nodes(result)
    assert entry(result.report.unmapped, "50") == {
        "id": "50", "type": "UltimateSDUpscale",
        "reason": "no node type on this farm does what UltimateSDUpscale does"}
    assert "50 (UltimateSDUpscale)" in entry(result.report.dropped, "51")["reason"]


def test_an_unmapped_node_the_only_output_needs_is_a_clear_error():
    ui = turbo_ui()
    ui.node(1)["type"] = "unCLIPCheckpointLoader"
    ui.node(1)["widgets_values"] = ["sd21-unclip-h.ckpt"]
    err = refused(ui.doc())
    assert (err.code, err.node_id) == ("unmapped_node", "1")
    assert "unCLIPCheckpointLoader" in err.message and err.report is not None
    assert entry(err.report.unmapped, "1")["type"] == "unCLIPCheckpointLoader"


@pytest.mark.parametrize(("raw", "code"), [
    (b"{not json", "not_json"),
    (b"[1, 2]", "not_a_workflow"),
    (b'{"nodes": [], "links": []}', "no_output"),
])
def test_what_is_not_a_runnable_workflow_is_refused(raw, code):
    with pytest.raises(ImportInvalid) as err:
        imported(workflow_parse(raw))
    assert err.value.code == code


def test_a_dangling_link_is_refused_naming_the_node():
    ui = turbo_ui()
    ui.links = [ln for ln in ui.links if ln[3] != 10]
    err = refused(ui.doc())
    assert (err.code, err.node_id) == ("dangling_link", "10")
    api = workflow("z_image_turbo.api.json")
    api["9"]["inputs"]["images"] = ["404", 0]
    err = refused(api)
    assert (err.code, err.node_id) == ("dangling_link", "9")


# --- the image-to-image set -------------------------------------------------------------------


def test_image_nodes_map_and_the_loaded_file_is_listed_as_an_asset():
    ui = Ui()
    ui.add(1, "LoadImage", ["cat.png", "image"], outputs=["IMAGE", "MASK"])
    ui.add(2, "ImageScale", ["nearest-exact", 640, 480, "disabled"], inputs=[("image", "IMAGE")],
           outputs=["IMAGE"])
    ui.add(3, "ImageCrop", [320, 240, 10, 20], inputs=[("image", "IMAGE")], outputs=["IMAGE"])
    ui.add(4, "PreviewImage", [], inputs=[("images", "IMAGE")])
    ui.link(1, 0, 2, "image").link(2, 0, 3, "image").link(3, 0, 4, "images")
    result = imported(ui.doc())
    graph = nodes(result)
    assert graph["1"]["params"] == {"asset": "cat.png"}
    assert graph["2"]["params"] == {"width": 640, "height": 480, "method": "nearest",
                                    "fit": "stretch", "pad_color": "black"}
    assert graph["3"]["params"] == {"x": 10, "y": 20, "width": 320, "height": 240}
    assert graph["4"]["params"] == {"label": "preview", "format": "png", "quality": 90}
    assert result.target == "4"
    assert result.report.assets == [{"id": "1", "type": "LoadImage", "file": "cat.png"}]


def test_ksampler_advanced_keeps_its_step_window():
    api = workflow("z_image_turbo.api.json")
    sampler = api["57:3"]
    sampler["class_type"] = "KSamplerAdvanced"
    sampler["inputs"] = {**{k: v for k, v in sampler["inputs"].items() if k not in ("seed",
                                                                                    "denoise")},
                         "noise_seed": 5, "add_noise": "enable", "start_at_step": 2,
                         "end_at_step": 10000, "return_with_leftover_noise": "disable"}
    graph = nodes(imported(api))
    assert graph["57:3"]["type"] == "sample/advanced"
    assert graph["57:3"]["params"] == {"seed": 5, "steps": 8, "guidance": 0.0, "denoise": 1.0,
                                       "shift": 3.0, "parallel": "auto",
                                       "sampler": "default", "scheduler": "default",
                                       "start_step": 2, "end_step": 10000, "add_noise": True,
                                       "return_with_leftover_noise": False}


def test_a_comfy_seed_beyond_what_json_holds_wraps_around_with_a_warning():
    result = imported(turbo_ui(ksampler=[2**64 - 1, "randomize", 8, 1, "euler", "simple", 1]).doc())
    assert nodes(result)["8"]["params"]["seed"] == (2**64 - 1) % 2**53
    assert "2^53" in entry(result.report.warnings, "8")["message"]


def sampler(doc: dict[str, Any]) -> dict[str, Any]:
    return next(node for node in doc["nodes"] if node["type"] == "KSampler")


@pytest.mark.parametrize(("breakage", "code", "node_id"), [
    (lambda doc: doc["links"].append(["x", "y", 0, 1, 0, "MODEL"]), "bad_workflow", None),
    (lambda doc: doc["nodes"][0].update(mode="loud"), "bad_workflow", None),
    (lambda doc: doc.update(definitions={"subgraphs": [{"id": "UNETLoader", "nodes": 5}]}),
     "bad_workflow", None),
    # The same breakages as below, on nodes that need what they break: the sampler's wired
    # inputs, the loader's file name.
    (lambda doc: sampler(doc).update(inputs="nope"), "missing_input", "8"),
    (lambda doc: doc["nodes"][0].update(widgets_values=None), "missing_param", "1"),
])
def test_a_malformed_workflow_is_refused_not_a_crash(breakage, code, node_id):
    doc = turbo_ui().doc()
    breakage(doc)
    err = refused(doc)
    assert (err.code, err.node_id) == (code, node_id), err.message
    if code == "bad_workflow":
        assert err.message.startswith("the workflow is malformed ("), err.message


def test_a_shift_node_without_its_value_leaves_the_family_default_with_a_warning():
    doc = turbo_ui().doc()
    doc["nodes"][3].update(widgets_values=None)
    result = imported(doc)
    assert nodes(result)["8"]["params"]["shift"] is None
    assert "shift is not a number" in entry(result.report.warnings, "4")["message"]


@pytest.mark.parametrize("breakage", [
    lambda doc: doc["nodes"][0].update(inputs="nope"),  # the model loader has no inputs
])
def test_a_malformed_field_that_feeds_nothing_in_the_graph_changes_nothing(breakage):
    doc = turbo_ui().doc()
    breakage(doc)
    intact = imported(turbo_ui().doc())
    result = imported(doc)
    assert result.graph == intact.graph and result.target == intact.target
    assert result.report.to_wire() == intact.report.to_wire()
