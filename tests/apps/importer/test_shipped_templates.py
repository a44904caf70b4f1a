"""ComfyUI's own shipped workflows (the `comfyui-workflow-templates-json` package the editor's
templates browser reads) through the importer: what their subgraphs, prompt-enhancer switches,
value previews and speed caches become here, and the node the farm lacks when one is needed."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from apps.importer.comfy_templates import shipped_file
from apps.importer.report import ImportInvalid
from apps.importer.services import comfy_import


def shipped(name: str) -> dict[str, Any]:
    found = shipped_file(f"{name}.json")
    assert found is not None, name
    return json.loads(found)


def instance(workflow: dict[str, Any]) -> dict[str, Any]:
    """The workflow's one subgraph instance (the templates wrap their model in one)."""
    ids = {s["id"] for s in workflow["definitions"]["subgraphs"]}
    return next(n for n in workflow["nodes"] if n["type"] in ids)


def by_type(result: Any) -> dict[str, dict[str, Any]]:
    return {n["type"]: n for n in result.graph.model_dump()["nodes"].values()}


def test_qwen_image_2_1_t2i_imports_with_its_prompt_enhancer_off():
    workflow = shipped("image_qwen_image_2_1_t2i")
    prompt = instance(workflow)["widgets_values"][0]
    result = comfy_import(workflow=workflow, catalog={})
    nodes = by_type(result)
    # The subgraph's widget values follow its definition's inputs (the instance lists only
    # some): the prompt, 25 steps, cfg 1 (no CFG) and the template's seed reach the nodes.
    assert nodes["qwenimage21/encode"]["params"]["text"] == prompt
    assert nodes["sample"]["params"] | {"steps": 25, "guidance": 0.0, "seed": 447606998181262} \
        == nodes["sample"]["params"]
    assert nodes["latent/empty"]["inputs"]["width"] == {"node": "13", "port": "width"}
    assert "TextGenerate" not in {n["type"] for n in result.report.mapped}
    dropped = {d["type"]: d["reason"] for d in result.report.dropped}
    assert "TextGenerate (node 459:471)" in dropped["ComfySwitchNode"]
    assert "on_false" in dropped["ComfySwitchNode"]
    assert "speed cache" in dropped["QwenImage21Cache"]
    # The sampler reads the model straight from the loader (the cache folded away).
    assert nodes["sample"]["inputs"]["model"]["node"] == "459:451"


def test_the_same_workflow_with_the_enhancer_on_names_the_node_it_needs():
    workflow = shipped("image_qwen_image_2_1_t2i")
    on = copy.deepcopy(workflow)
    instance(on)["widgets_values"][1] = True  # the subgraph's `switch`: enhance the prompt
    with pytest.raises(ImportInvalid) as refused:
        comfy_import(workflow=on, catalog={})
    assert refused.value.code == "unmapped_node" and "TextGenerate" in refused.value.message


def test_krea_2_turbo_ships_with_its_enhancer_on_and_says_so():
    with pytest.raises(ImportInvalid) as refused:
        comfy_import(workflow=shipped("image_krea2_turbo_t2i"), catalog={})
    assert refused.value.code == "unmapped_node"
    assert refused.value.node_id == "30:16" and "TextGenerate" in refused.value.message


def test_a_value_preview_on_the_way_hands_its_value_on():
    """PreviewAny between a prompt and its encoder (as the templates wire it): the encoder gets
    the text, and the preview still shows it."""
    prompt = {
        "1": {"class_type": "PreviewAny", "inputs": {"source": ["4", 0]}},  # the target
        "2": {"class_type": "PrimitiveStringMultiline", "inputs": {"value": "a red fox"}},
        "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}},  # on the way
        "4": {"class_type": "StringConcatenate",
              "inputs": {"string_a": ["3", 0], "string_b": ", at dusk", "delimiter": ""}},
    }
    result = comfy_import(workflow=prompt, catalog={})
    graph = result.graph.model_dump()["nodes"]
    assert result.target == "1"
    assert graph["4"]["inputs"]["string_a"] == {"node": "2", "port": "text"}
    assert graph["3"] == {"type": "util/preview", "params": {},
                          "inputs": {"source": {"node": "2", "port": "text"}}}


def test_a_switch_whose_both_branches_run_here_stays_a_switch():
    """Settling at import is only for a branch the farm cannot run: otherwise the choice stays
    in the graph, so a run can flip it."""
    prompt = {
        "1": {"class_type": "PrimitiveStringMultiline", "inputs": {"value": "yes"}},
        "2": {"class_type": "PrimitiveStringMultiline", "inputs": {"value": "no"}},
        "3": {"class_type": "PrimitiveBoolean", "inputs": {"value": False}},
        "4": {"class_type": "ComfySwitchNode",
              "inputs": {"switch": ["3", 0], "on_true": ["1", 0], "on_false": ["2", 0]}},
        "5": {"class_type": "PreviewAny", "inputs": {"source": ["4", 0]}},
    }
    graph = comfy_import(workflow=prompt, catalog={}).graph.model_dump()["nodes"]
    assert graph["4"]["type"] == "switch/text"


def _with_method(workflow: dict[str, Any], method: str) -> dict[str, Any]:
    changed = copy.deepcopy(workflow)
    for node in changed["definitions"]["subgraphs"][0]["nodes"]:
        if node["type"] == "FluxKontextMultiReferenceLatentMethod":
            node["widgets_values"] = [method]
    return changed


def test_qwen_image_edit_2511_reads_its_references_at_timestep_zero():
    """The 2511 template's FluxKontextMultiReferenceLatentMethod ("index_timestep_zero" on both
    prompts) becomes the reference-latent node's `method` on each edit prompt the sampler
    reads."""
    result = comfy_import(workflow=shipped("image_qwen_image_edit_2511_int8"), catalog={})
    assert result.report.unmapped == []
    nodes = result.graph.model_dump()["nodes"]
    sampler = next(n for n in nodes.values() if n["type"] == "sample")
    for port in ("positive", "negative"):
        method = nodes[sampler["inputs"][port]["node"]]
        assert method["type"] == "qwenimage/reference-latent"
        assert method["params"] == {"method": "index_timestep_zero"}
        assert nodes[method["inputs"]["conditioning"]["node"]]["type"] == "qwenimage/edit"
    mapped = {m["id"]: m["as"] for m in result.report.mapped}
    assert mapped["170:147"] == mapped["170:148"] == "qwenimage/reference-latent"


def test_the_index_method_maps_and_offset_is_refused_naming_the_method():
    workflow = shipped("image_qwen_image_edit_2511_int8")
    index = comfy_import(workflow=_with_method(workflow, "index"), catalog={})
    assert index.graph.model_dump()["nodes"]["170:147"]["params"] == {"method": "index"}
    for method in ("offset", "uxo/uno"):
        with pytest.raises(ImportInvalid) as refused:
            comfy_import(workflow=_with_method(workflow, method), catalog={})
        assert refused.value.code == "unmapped_node"
        assert refused.value.node_id in ("170:147", "170:148")
        assert f"FluxKontextMultiReferenceLatentMethod {method!r} is not supported on " \
               "Qwen-Image" in refused.value.message


def test_a_reference_latents_method_on_a_flux1_prompt_is_refused_naming_the_method():
    with pytest.raises(ImportInvalid) as refused:
        comfy_import(workflow=shipped("flux1_dev_uso_reference_image_gen"), catalog={})
    assert refused.value.code == "unmapped_node"
    assert "FluxKontextMultiReferenceLatentMethod 'uxo/uno'" in refused.value.message
    assert "only Qwen-Image(-Edit) prompts take a reference latents method" in \
        refused.value.message


def test_the_method_on_a_krea_2_or_longcat_prompt_is_refused_though_a_qwen_edit_node_encodes_it():
    """Krea 2's style reference and LongCat's edit template encode with ComfyUI's Qwen-Image-Edit
    prompt nodes: the prompt's family is its text encoder's (the loader's type), not the
    prompt node's."""
    for name, node, on in (("image_krea2_turbo_int8_image_style_reference", "30:53",
                            "on a Krea 2 prompt"),
                           ("image_longcat_image_edit", "22:15", "on a longcat_image prompt")):
        with pytest.raises(ImportInvalid) as refused:
            comfy_import(workflow=shipped(name), catalog={})
        assert refused.value.node_id == node
        assert "FluxKontextMultiReferenceLatentMethod" in refused.value.message
        assert on in refused.value.message
