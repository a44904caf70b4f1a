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
    # The switch is settled (its off branch is the prompt's value, and a switch here switches
    # linked nodes): the enhancer, off, reaches no output.
    assert "text/generate" not in nodes
    dropped = {d["type"]: d["reason"] for d in result.report.dropped}
    assert "its switch is False" in dropped["ComfySwitchNode"]
    assert "459:471" in {d["id"] for d in result.report.dropped if d["type"] == "TextGenerate"}
    assert "speed cache" in dropped["QwenImage21Cache"]
    # The sampler reads the model straight from the loader (the cache folded away).
    assert nodes["sample"]["inputs"]["model"]["node"] == "459:451"


def test_the_same_workflow_with_the_enhancer_on_generates_the_prompt():
    workflow = shipped("image_qwen_image_2_1_t2i")
    on = copy.deepcopy(workflow)
    instance(on)["widgets_values"][1] = True  # the subgraph's `switch`: enhance the prompt
    result = comfy_import(workflow=on, catalog={})
    nodes = result.graph.model_dump()["nodes"]
    enhancer = nodes["459:471"]
    assert enhancer["type"] == "text/generate"
    # the dynamic combo's widgets as saved: on, temperature 1, top_k 20, top_p 0.95, min_p 0,
    # repetition 1, its seed (linked from the subgraph's), thinking from the subgraph
    assert enhancer["params"] | {"sampling": "on", "temperature": 1.0, "top_k": 20,
                                 "top_p": 0.95, "min_p": 0.0, "repetition_penalty": 1.0,
                                 "presence_penalty": 1.5, "use_default_template": True} \
        == enhancer["params"]
    # its system prompt (a 10k-character text node) is the system turn
    assert enhancer["inputs"]["system"] == {"node": "459:475", "port": "text"}
    assert len(nodes["459:475"]["params"]["value"]) > 10_000
    # the encoder reads the generated text (the switch, settled, passes its on_true on)
    assert nodes["459:452"]["inputs"]["text"] == {"node": "459:471", "port": "text"}
    assert not [w for w in result.report.warnings if w["type"] == "TextGenerate"]


def test_krea_2_turbo_ships_with_its_enhancer_on_and_maps_it():
    result = comfy_import(workflow=shipped("image_krea2_turbo_t2i"), catalog={})
    nodes = result.graph.model_dump()["nodes"]
    assert nodes["30:16"]["type"] == "text/generate"
    # Its switch is on (the template's PrimitiveBoolean): settled to the generated text.
    assert "30:21" not in nodes
    assert any(d["id"] == "30:21" and "its switch is True" in d["reason"]
               for d in result.report.dropped)


def test_text_generate_in_the_api_format_reads_its_dynamic_combo():
    prompt = {
        "1": {"class_type": "CLIPLoader",
              "inputs": {"clip_name": "qwen3vl.safetensors", "type": "krea2"}},
        "2": {"class_type": "TextGenerate",
              "inputs": {"clip": ["1", 0], "prompt": "a fox", "max_length": 64,
                         "sampling_mode": "on", "sampling_mode.temperature": 0.5,
                         "sampling_mode.top_k": 10, "sampling_mode.top_p": 0.9,
                         "sampling_mode.min_p": 0.1, "sampling_mode.repetition_penalty": 1.2,
                         "sampling_mode.seed": 42, "sampling_mode.presence_penalty": 0.0,
                         "thinking": True, "use_default_template": False}},
        "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}},
    }
    result = comfy_import(workflow=prompt, catalog={})
    node = result.graph.model_dump()["nodes"]["2"]
    assert node["params"] == {"prompt": "a fox", "max_length": 64, "sampling": "on",
                              "temperature": 0.5, "top_k": 10, "top_p": 0.9, "min_p": 0.1,
                              "repetition_penalty": 1.2, "seed": 42, "presence_penalty": 0.0,
                              "thinking": True, "use_default_template": False, "system": "",
                              "template": "model"}
    assert node["inputs"] == {"encoder": {"node": "1", "port": "encoder"}}
    assert not [w for w in result.report.warnings if w["type"] == "TextGenerate"]


def ui_text_generate(values: list[Any], comfy_type: str = "TextGenerate",
                     image: bool = False) -> dict[str, Any]:
    """A UI-format workflow: a CLIPLoader into a `comfy_type` saved with `values`, previewed
    (and a LoadImage into its image input with `image`)."""
    nodes: list[dict[str, Any]] = [
        {"id": 1, "type": "CLIPLoader", "mode": 0,
         "widgets_values": ["q.safetensors", "krea2", "default"],
         "outputs": [{"name": "CLIP", "type": "CLIP", "links": [1]}], "inputs": []},
        {"id": 2, "type": comfy_type, "mode": 0, "widgets_values": values,
         "inputs": [{"name": "clip", "type": "CLIP", "link": 1},
                    *([{"name": "image", "type": "IMAGE", "link": 3}] if image else [])],
         "outputs": [{"name": "STRING", "type": "STRING", "links": [2]}]},
        {"id": 3, "type": "PreviewAny", "mode": 0, "widgets_values": [],
         "inputs": [{"name": "source", "type": "*", "link": 2}], "outputs": []},
    ]
    links = [[1, 1, 0, 2, 0, "CLIP"], [2, 2, 0, 3, 0, "STRING"]]
    if image:
        nodes.append({"id": 4, "type": "LoadImage", "mode": 0,
                      "widgets_values": ["fox.png", "image"],
                      "outputs": [{"name": "IMAGE", "type": "IMAGE", "links": [3]}],
                      "inputs": []})
        links.append([3, 4, 0, 2, 1, "IMAGE"])
    return {"nodes": nodes, "links": links}


@pytest.mark.parametrize(("values", "expected"), [
    # ComfyUI's newest save: presence_penalty, both flags, mtp (Qwen-Image 2.1's templates)
    (["", 4096, "on", 1, 20, 0.95, 0, 1, 5, 1.5, True, True, "auto"],
     {"sampling": "on", "temperature": 1, "top_k": 20, "repetition_penalty": 1, "seed": 5,
      "presence_penalty": 1.5, "thinking": True, "use_default_template": True}),
    # presence_penalty and the flags, no mtp (Krea 2's)
    (["", 512, "on", 0.7, 64, 0.95, 0.05, 1.05, 0, 0, True, False],
     {"temperature": 0.7, "seed": 0, "presence_penalty": 0, "thinking": True,
      "use_default_template": False}),
    # presence_penalty and thinking only (ERNIE-Image's)
    (["", 2048, "on", 0.6, 64, 0.8, 0.05, 1.05, 3, 0.5, False],
     {"seed": 3, "presence_penalty": 0.5, "thinking": False, "use_default_template": True}),
    # before presence_penalty: no presence, no flags (Qwen3's text-generation template)
    (["x", 2048, "on", 0.7, 64, 0.95, 0.05, 1.05, 7],
     {"sampling": "on", "seed": 7, "presence_penalty": 0.0, "thinking": False}),
    # before presence_penalty, with the flags
    (["x", 2048, "on", 0.7, 64, 0.95, 0.05, 1.2, 7, True, False],
     {"repetition_penalty": 1.2, "seed": 7, "presence_penalty": 0.0, "thinking": True,
      "use_default_template": False}),
    # a seed saved with its control_after_generate word
    (["x", 512, "on", 0.7, 64, 0.95, 0.05, 1.05, 9, "randomize", 0.25, True, True, "off"],
     {"seed": 9, "presence_penalty": 0.25, "thinking": True}),
    # ComfyUI's "off": no sampling widgets; the flags, then mtp, or the flags alone
    (["x", 256, "off", True, False, "off"], {"sampling": "off", "thinking": True,
                                             "use_default_template": False}),
    (["x", 256, "off", True, False], {"sampling": "off", "thinking": True,
                                      "use_default_template": False}),
    (["x", 256, "off"], {"sampling": "off", "thinking": False, "use_default_template": True}),
    # saved by the editor from the farm's /object_info (plain widgets): "off" keeps the numbers
    (["x", 256, "off", 0.7, 64, 0.95, 0.05, 1.05, 3, 0.0, True, False, "auto"],
     {"sampling": "off", "seed": 3, "thinking": True, "use_default_template": False}),
    (["x", 256, "off", 0.7, 64, 0.95, 0.05, 1.05, 3, True, False],
     {"sampling": "off", "seed": 3, "thinking": True, "use_default_template": False}),
])
def test_text_generate_in_the_ui_format_reads_every_save_comfyui_writes(values, expected):
    from apps.importer.ui_format import widgets_by_name

    named = widgets_by_name("TextGenerate", values)
    result = comfy_import(workflow=ui_text_generate(values), catalog={})
    params = result.graph.model_dump()["nodes"]["2"]["params"]
    assert params | expected == params
    assert params["max_length"] == named["max_length"] == values[1]
    assert not [w for w in result.report.warnings if w["type"] == "TextGenerate"]


@pytest.mark.parametrize("odd", ["surprise", {"a": [1]}, [2, 3]])
def test_a_pinned_mtp_and_an_unknown_value_are_named(odd):
    values = ["x", 512, "on", 0.7, 64, 0.95, 0.05, 1.05, 9, 0.0, odd, True, True, "3"]
    result = comfy_import(workflow=ui_text_generate(values), catalog={})
    params = result.graph.model_dump()["nodes"]["2"]["params"]
    assert params | {"seed": 9, "thinking": True, "use_default_template": True} == params
    warned = [w["message"] for w in result.report.warnings if w["type"] == "TextGenerate"]
    assert any("mtp 3 is ignored" in m for m in warned)
    assert any(f"{str(odd)!r} after the sampling mode" in m for m in warned)


def test_ltx_2s_prompt_enhancer_imports_as_text_generate_with_its_turns():
    """TextGenerateLTX2Prompt (the LTX-2.3 templates'): text/generate with ComfyUI's LTX-2 turns
    (`template: ltx2`), its widgets read as TextGenerate's, its image wired as TextGenerate's;
    ComfyUI's own system prompt text is not carried, and the report says so."""
    values = ["a fox runs", 2048, "on", 0.7, 64, 0.95, 0.05, 1.05, 0, 0, False, True]
    result = comfy_import(workflow=ui_text_generate(values, "TextGenerateLTX2Prompt", image=True),
                         catalog={})
    node = result.graph.model_dump()["nodes"]["2"]
    assert node["type"] == "text/generate"
    assert node["params"] | {"template": "ltx2", "prompt": "a fox runs", "max_length": 2048,
                             "sampling": "on", "temperature": 0.7, "repetition_penalty": 1.05,
                             "seed": 0, "thinking": False,
                             "use_default_template": True} == node["params"]
    assert node["inputs"]["image"] == {"node": "4", "port": "image"}
    assert {"id": "2", "type": "TextGenerateLTX2Prompt", "as": "text/generate"} \
        in result.report.mapped
    warned = [w["message"] for w in result.report.warnings
              if w["type"] == "TextGenerateLTX2Prompt"]
    assert any("own LTX-2 system prompt" in m and "not carried" in m for m in warned)


def test_ltx_2_3_i2v_with_its_enhancer_on_leaves_the_enhancers_image_out_and_says_so():
    """ComfyUI shows TextGenerateLTX2Prompt's image to Gemma 3's vision tower; the farm's
    LTX-2 Gemma reads no images, so the image is left out of text/generate (a warning naming
    it) and the enhanced prompt still feeds the encode; the clip keeps its first frame."""
    workflow = shipped("video_ltx2_3_i2v")
    instance(workflow)["widgets_values"][1] = True  # prompt_enhance (the values skip first_frame)
    result = comfy_import(workflow=workflow, catalog={})
    nodes = result.graph.model_dump()["nodes"]
    assert nodes["320:325"]["type"] == "text/generate"
    assert set(nodes["320:325"]["inputs"]) == {"prompt", "encoder"}
    assert nodes["320:303"]["inputs"]["text"] == {"node": "320:325", "port": "text"}
    assert nodes["320:296"]["inputs"]["image"]["node"] == "320:330"  # the first frame
    [warned] = [w["message"] for w in result.report.warnings
                if w["id"] == "320:325" and "image" in w["message"]]
    assert warned.startswith("its image (node 320:330) is not passed to Gemma 3")
    assert result.report.unmapped == []


def test_ltx_2s_prompt_enhancer_in_the_api_format_takes_a_wired_system_prompt():
    prompt = {
        "1": {"class_type": "CLIPLoader", "inputs": {"clip_name": "g.safetensors", "type": "krea2"}},
        "2": {"class_type": "PrimitiveStringMultiline", "inputs": {"value": "Be brief."}},
        "3": {"class_type": "TextGenerateLTX2Prompt",
              "inputs": {"clip": ["1", 0], "prompt": "a fox", "max_length": 64,
                         "sampling_mode": "off", "system_prompt": ["2", 0], "mtp": "auto"}},
        "4": {"class_type": "PreviewAny", "inputs": {"source": ["3", 0]}},
    }
    node = comfy_import(workflow=prompt, catalog={}).graph.model_dump()["nodes"]["3"]
    assert node["params"] | {"prompt": "a fox", "max_length": 64, "sampling": "off",
                             "template": "ltx2"} == node["params"]
    assert node["inputs"]["system"] == {"node": "2", "port": "text"}


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


def test_a_switch_decided_at_run_time_stays_a_switch():
    """Settling at import is for a choice the workflow fixes; one a math expression computes
    stays in the graph, lazy."""
    prompt = {
        "1": {"class_type": "PrimitiveStringMultiline", "inputs": {"value": "yes"}},
        "2": {"class_type": "PrimitiveStringMultiline", "inputs": {"value": "no"}},
        "3": {"class_type": "PrimitiveInt", "inputs": {"value": 5}},
        "4": {"class_type": "ComfyMathExpression",
              "inputs": {"expression": "a > 3", "values.a": ["3", 0]}},
        "5": {"class_type": "ComfySwitchNode",
              "inputs": {"switch": ["4", 2], "on_true": ["1", 0], "on_false": ["2", 0]}},
        "6": {"class_type": "PreviewAny", "inputs": {"source": ["5", 0]}},
    }
    graph = comfy_import(workflow=prompt, catalog={}).graph.model_dump()["nodes"]
    assert graph["5"]["type"] == "switch/text"
    assert graph["5"]["inputs"]["switch"] == {"node": "4", "port": "bool"}


def test_object_info_lists_text_generate_for_the_editor():
    from apps.importer.comfy_object_info import object_info

    spec = object_info(catalog={}, uploads=[])["TextGenerate"]
    assert spec["input"]["required"]["clip"] == ["CLIP"]
    assert spec["input"]["optional"] == {"image": ["IMAGE"], "system_prompt": ["STRING"]}
    assert spec["input"]["required"]["mtp"][0] == ["auto", "off", "2", "3", "4", "5"]
    assert spec["input"]["required"]["sampling_mode"][0] == ["on", "off"]
    assert spec["output"] == ["STRING", "STRING"]  # generated_text, thinking


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


def test_an_inpaint_conditioning_on_another_familys_prompt_is_refused_naming_the_family():
    workflow = shipped("flux_fill_inpaint_example")
    loader = next(n for n in workflow["definitions"]["subgraphs"][0]["nodes"]
                  if n["type"] == "DualCLIPLoader")
    loader["widgets_values"][2] = "qwen_image"
    with pytest.raises(ImportInvalid) as refused:
        comfy_import(workflow=workflow, catalog={})
    assert refused.value.code == "unmapped_node" and refused.value.node_id == "47:38"
    assert "InpaintModelConditioning on a Qwen-Image prompt is not supported" in \
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


def test_an_imagestitch_passes_image1_through_only_when_its_image2_is_unwired():
    """The Kontext template bypasses its second LoadImage: its ImageStitch is left out and the
    scale reads the first image. The stitching template wires both: still refused."""
    result = comfy_import(workflow=shipped("flux_kontext_dev_basic"), catalog={})
    nodes = result.graph.model_dump()["nodes"]
    assert nodes["192:42"]["inputs"]["image"] == {"node": "190", "port": "image"}
    dropped = {d["id"]: d["reason"] for d in result.report.dropped}
    assert "its image2 is unwired" in dropped["192:146"]
    with pytest.raises(ImportInvalid) as refused:
        comfy_import(workflow=shipped("utility_image_stitch"), catalog={})
    assert "ImageStitch" in refused.value.message


MOST_USED_THAT_RUN_HERE = (
    "image_z_image_turbo", "image_qwen_image_2_1_image_edit", "video_wan2_2_14B_i2v",
    "image_krea2_turbo_t2i", "image_qwen_image_2_1_t2i", "image_qwen_image_edit_2509",
    "image_flux2", "image_qwen_image_2_1_turbo_image_edit", "image_qwen_image_edit_2511_int8",
    "image_flux2_klein_image_edit_9b_base", "video_wan2_2_14B_flf2v", "video_wan2_2_14B_t2v",
    "video_wan2_2_5B_ti2v", "image_sdxl_simple", "flux_dev_checkpoint_example",
    "video_ltx2_3_i2v", "video_ltx2_3_t2v", "video_ltx2_5_i2v", "video_ltx2_5_t2v",
    "video_ltx2_5_flf2v", "video_ltx2_3_flf2v", "video_ltx2_i2v", "sdxlturbo_example",
    "utility-gan_upscaler", "templates-6-key-frames",
    "flux_kontext_dev_basic",
    "flux_fill_inpaint_example", "flux_fill_outpaint_example", "image_flux.1_fill_dev_OneReward",
    "template_qwen_multiangle.app", "video_ltx2_3_ia2v", "video_minimax_h3_i2v",
    "video_minimax_h3_t2v", "video_fastvideo_fasth3_i2v", "video_fastvideo_fasth3_t2v",
    "video_minimax_h3_r2v",
)


def test_the_most_used_shipped_workflows_of_the_farms_families_import():
    """A guard on `./farm manage farm_templates`: ComfyUI's most used workflows for the families
    this farm runs import, and the share of all shipped use that imports does not fall below
    this session's (2026-12-04: 34.2%; 42.1% with LTX-2.3 image-to-video; 42.3% with its
    text-to-video, whose prompt enhancer TextGenerateLTX2Prompt imports as text/generate; 44.8%
    with LTX-2.5's image- and text-to-video, from ComfyUI's separate files: ltx2/load-files;
    44.9% with FLUX.1 Kontext dev: flux1/reference-latent; 45.2% with FLUX.1 Fill's inpaint,
    outpaint and OneReward: flux1/inpaint, model/differential-diffusion; 45.5% with the Qwen
    multi-angle app: text/camera-angle; 45.8% with LTX-2.5's and LTX-2.3's first-last-frame
    to video and LTX-2.3's style transition: ltx2/add-guide; 45.9% with LTX-2's image-to-video,
    whose half size is an EmptyImage scaled: image/empty, and SDXL Turbo's example:
    sampling/sd-turbo-scheduler; 46.0% with the GAN video upscaler: frames/upscale-with-model,
    and the six-key-frame Wan 2.2 film: frames/batch; 46.5% with LTX-2.3's image + sound to
    video, lip-synced to an uploaded sound: audio/load, audio/trim, ltx2/encode-audio; 58.0%
    with MiniMax-H3's image- and text-to-video (and its i2v continuation, the same subgraph):
    minimaxh3/load-files, minimaxh3/image-to-video, /sample, /decode; 59.4% with FastVideo's
    FastH3: MiniMaxH3SigmaShift as minimaxh3/sample's shifts, its sparse attention folded;
    63.2% with its reference-to-video from images: minimaxh3/reference-to-video)."""
    from apps.importer.comfy_templates import shipped_coverage, shipped_imports

    why_not = {name: shipped_imports().get(name, "not shipped") for name in MOST_USED_THAT_RUN_HERE}
    assert {name: why for name, why in why_not.items() if why is not None} == {}
    assert shipped_coverage()["share"] >= 0.631


def test_the_multi_angle_app_s_camera_angle_writes_its_edit_prompt():
    """ComfyUI's CameraAngle becomes text/camera-angle with its three angles; its prompt output
    is the edit's text (its camera_info feeds nothing, its image only its 3D preview)."""
    result = comfy_import(workflow=shipped("template_qwen_multiangle.app"), catalog={})
    nodes = result.graph.model_dump()["nodes"]
    assert nodes["221"]["type"] == "text/camera-angle"
    assert nodes["221"]["params"] == {"horizontal_angle": 333, "vertical_angle": 17, "zoom": 5.0}
    edit = nodes["219:151"]
    assert edit["type"] == "qwenimage/edit"
    assert edit["inputs"]["text"] == {"node": "221", "port": "prompt"}


def test_a_reference_on_a_zeroed_negative_is_cut_with_it():
    """FLUX.2 Klein's distilled edit template builds its negative as ReferenceLatent of
    ConditioningZeroOut (at cfg 1, unused): both are cut, the guider's negative left unwired,
    the positive keeps its reference."""
    result = comfy_import(workflow=shipped("image_flux2_klein_image_edit_4b_distilled"),
                         catalog={})
    nodes = result.graph.model_dump()["nodes"]
    guider = nodes["75:63"]
    assert guider["type"] == "sampling/cfg-guider" and "negative" not in guider["inputs"]
    assert nodes[guider["inputs"]["positive"]["node"]]["type"] == "flux2/reference-latent"
    dropped = {d["id"]: d["reason"] for d in result.report.dropped}
    assert "zeroed-out negative" in dropped["75:121"]
