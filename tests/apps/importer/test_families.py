"""The importer and model families: which family a workflow needs (loader types, the held
files' contents, family-only node types), a workflow for a family the farm does not run refused
as `unsupported_family`, and what each family makes of FluxGuidance, ModelSampling* and cfg."""

from __future__ import annotations

import math
from typing import Any

import pytest

from apps.importer.comfy_families import FLUX_DEFAULT_GUIDANCE, flux_shift
from apps.importer.report import ImportInvalid
from apps.importer.services import comfy_import
from tests.apps.importer.builder import CATALOG as ZIMAGE_CATALOG
from tests.apps.importer.builder import turbo_ui

CATALOG = {"diffusion_models": ["flux1-dev.safetensors"], "vae": ["ae.safetensors"],
           "text_encoders": ["clip_l.safetensors", "t5xxl_fp16.safetensors"]}
FLUX_FILES = {("diffusion_models", "flux1-dev.safetensors"): ("flux1",),
              ("vae", "ae.safetensors"): ("flux1", "zimage"),
              ("text_encoders", "clip_l.safetensors"): ("flux1",),
              ("text_encoders", "t5xxl_fp16.safetensors"): ("flux1",)}


def flux_workflow(clip_type: str = "flux", cfg: float = 1.0) -> dict[str, Any]:
    """FLUX.1 dev as ComfyUI's template has it: FluxGuidance on the prompt, cfg 1."""
    return {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": "flux1-dev.safetensors",
                                                     "weight_dtype": "default"}},
        "2": {"class_type": "DualCLIPLoader", "inputs": {
            "clip_name1": "clip_l.safetensors", "clip_name2": "t5xxl_fp16.safetensors",
            "type": clip_type, "device": "default"}},
        "3": {"class_type": "VAELoader", "inputs": {"vae_name": "ae.safetensors"}},
        "4": {"class_type": "CLIPTextEncode", "inputs": {"text": "a fox", "clip": ["2", 0]}},
        "5": {"class_type": "EmptySD3LatentImage", "inputs": {"width": 64, "height": 64,
                                                              "batch_size": 1}},
        "6": {"class_type": "KSampler", "inputs": {
            "model": ["1", 0], "positive": ["10", 0], "negative": ["4", 0],
            "latent_image": ["5", 0], "seed": 1, "steps": 4, "cfg": cfg, "sampler_name": "euler",
            "scheduler": "simple", "denoise": 1.0}},
        "7": {"class_type": "VAEDecode", "inputs": {"samples": ["6", 0], "vae": ["3", 0]}},
        "8": {"class_type": "SaveImage", "inputs": {"images": ["7", 0], "filename_prefix": "f"}},
        "10": {"class_type": "FluxGuidance", "inputs": {"guidance": 4.0, "conditioning": ["4", 0]}},
    }


def imported(doc: dict[str, Any], files: Any = None, catalog: Any = None) -> Any:
    return comfy_import(workflow=doc, catalog=CATALOG if catalog is None else catalog,
                        files=files)


def refused(doc: dict[str, Any], files: Any = None) -> ImportInvalid:
    with pytest.raises(ImportInvalid) as err:
        imported(doc, files)
    return err.value


def sampler_params(result: Any, node_id: str = "6") -> dict[str, Any]:
    return result.graph.model_dump()["nodes"][node_id]["params"]


def warnings_of(result: Any, node_id: str) -> list[str]:
    return [w["message"] for w in result.report.to_wire()["warnings"] if w["id"] == node_id]


# --- loaders ----------------------------------------------------------------------------------


def test_a_dual_clip_loader_becomes_one_text_encoder_loader_with_both_files():
    result = imported(flux_workflow())
    loader = result.graph.model_dump()["nodes"]["2"]
    assert loader["type"] == "load/text-encoder"
    assert loader["params"] == {"file": "clip_l.safetensors", "file_2": "t5xxl_fp16.safetensors",
                                "family": "flux1"}  # the loader's `type`
    assert not warnings_of(result, "2")


def test_comfyui_s_default_sdxl_workflow_loads_its_checkpoint_as_one_node_with_three_outputs():
    from tests.apps.importer.builder import workflow

    catalog = {"checkpoints": ["sd_xl_base_1.0.safetensors"]}
    result = comfy_import(workflow=workflow("sdxl_base.ui.json"), catalog=catalog)
    nodes = result.graph.model_dump()["nodes"]
    assert nodes["4"] == {"type": "load/checkpoint",
                          "params": {"file": "sd_xl_base_1.0.safetensors"}, "inputs": {}}
    assert nodes["3"]["inputs"]["model"] == {"node": "4", "port": "model"}
    assert nodes["6"]["inputs"]["encoder"] == nodes["7"]["inputs"]["encoder"] == {
        "node": "4", "port": "encoder"}
    assert nodes["8"]["inputs"]["vae"] == {"node": "4", "port": "vae"}
    assert nodes["3"]["params"]["guidance"] == 7.0  # cfg 8: cond + 7·(cond − uncond)
    assert result.report.to_wire()["models"] == [{
        "id": "4", "type": "CheckpointLoaderSimple", "folder": "checkpoints",
        "name": "sd_xl_base_1.0.safetensors", "held": True}]

# --- which family: refused when the farm does not run it --------------------------------------


def _clip_type(doc: dict[str, Any], clip_type: str) -> None:
    doc["2"]["inputs"]["type"] = clip_type


def _node(class_type: str, inputs: dict[str, Any]):
    def add(doc: dict[str, Any]) -> None:
        doc["20"] = {"class_type": class_type, "inputs": inputs}
        doc["6"]["inputs"]["positive"] = ["20", 0]
    return add


@pytest.mark.parametrize(("change", "node_id", "family"), [
    (lambda doc: _clip_type(doc, "sd3"), "2", "sd3"),
    (lambda doc: _clip_type(doc, "hidream"), "2", "hidream"),
    (lambda doc: doc.update({"2": {"class_type": "CLIPLoader", "inputs": {
        "clip_name": "llava.safetensors", "type": "hunyuan_video", "device": "default"}}}), "2",
     "hunyuan-video"),
    (lambda doc: doc.update({"2": {"class_type": "CLIPLoader", "inputs": {
        "clip_name": "byt5.safetensors", "type": "hunyuan_image"}}}), "2", "hunyuan-image"),
    (lambda doc: doc.update({"2": {"class_type": "TripleCLIPLoader", "inputs": {
        "clip_name1": "clip_g.safetensors", "clip_name2": "clip_l.safetensors",
        "clip_name3": "t5xxl.safetensors"}}}), "2", "sd3"),
    (_node("CLIPTextEncodeHunyuanDiT", {"clip": ["2", 0], "bert": "x"}), "20", "hunyuan-dit"),
    (_node("LTXVConditioning", {"positive": ["4", 0], "frame_rate": 25}), "20", "ltxv"),
    (lambda doc: doc["5"].update(class_type="EmptyMochiLatentVideo"), "5", "mochi"),
])
def test_a_workflow_for_a_family_the_farm_does_not_run_is_unsupported_family(change, node_id,
                                                                           family):
    doc = flux_workflow()
    change(doc)
    err = refused(doc)
    assert (err.code, err.node_id) == ("unsupported_family", node_id), err.message
    assert f"needs the {family} model family" in err.message
    assert "flux1" in err.message and "zimage" in err.message  # what the farm runs instead


def test_a_held_model_file_no_family_recognises_is_unsupported_family():
    files = {**FLUX_FILES, ("diffusion_models", "flux1-dev.safetensors"): ()}
    err = refused(flux_workflow(), files)
    assert (err.code, err.node_id) == ("unsupported_family", "1"), err.message
    assert "no model family this farm runs recognises the weights of diffusion_models/" \
        "flux1-dev.safetensors" in err.message


def test_a_foreign_loader_that_feeds_no_output_refuses_nothing():
    doc = flux_workflow()
    doc["30"] = {"class_type": "CLIPLoader", "inputs": {"clip_name": "umt5.safetensors",
                                                        "type": "wan"}}
    assert imported(doc).target == "8"


def test_empty_sd3_latent_image_is_no_evidence_of_sd3():
    """Z-Image's and FLUX.1's own templates make their latent with it."""
    assert imported(flux_workflow()).report.to_wire()["mapped"]


def test_a_held_file_s_contents_decide_over_the_loader_type():
    """A Qwen3 file the fleet recognises as Z-Image's, loaded with another type, is Z-Image."""
    doc = turbo_ui().doc()
    doc["nodes"][1]["widgets_values"][1] = "sd3"
    with pytest.raises(ImportInvalid):
        comfy_import(workflow=doc, catalog=ZIMAGE_CATALOG)
    files = {("text_encoders", name): ("zimage",) for name in ZIMAGE_CATALOG["text_encoders"]}
    result = comfy_import(workflow=doc, catalog=ZIMAGE_CATALOG, files=files)
    assert result.graph.model_dump()["nodes"]["8"]["params"]["guidance"] == 0.0  # cfg 1
    assert any("type 'sd3' is overruled: the weights of text_encoders/qwen_3_4b.safetensors are "
               "zimage's"
               in m for m in warnings_of(result, "2"))


# --- FLUX.1: FluxGuidance, cfg, ModelSamplingFlux ---------------------------------------------


def test_flux_guidance_becomes_the_flux_sampler_s_guidance_and_is_reported_mapped_into_it():
    result = imported(flux_workflow(), FLUX_FILES)
    assert sampler_params(result)["guidance"] == 4.0
    assert sampler_params(result)["shift"] is None  # no ModelSampling*: the pipeline's own
    mapped = {e["id"]: e for e in result.report.to_wire()["mapped"]}
    assert mapped["10"] == {"id": "10", "type": "FluxGuidance", "as": "sample", "into": ["6"],
                            "param": "guidance"}
    assert not warnings_of(result, "6")


def test_a_flux_sampler_without_flux_guidance_gets_comfyuis_default_guidance():
    doc = flux_workflow()
    doc["6"]["inputs"]["positive"] = ["4", 0]
    del doc["10"]
    assert sampler_params(imported(doc))["guidance"] == FLUX_DEFAULT_GUIDANCE


def test_the_family_comes_from_the_model_file_s_contents_when_the_fleet_holds_it():
    doc = flux_workflow(clip_type="stable_diffusion")  # a type that names no one family
    doc["6"]["inputs"]["positive"] = ["4", 0]
    del doc["10"]
    doc["6"]["inputs"]["cfg"] = 3.0
    assert sampler_params(imported(doc))["guidance"] == 2.0  # no evidence: cfg − 1, as before
    assert any("type 'stable_diffusion' names no one model family" in m
               for m in warnings_of(imported(doc), "2"))
    result = imported(doc, FLUX_FILES)
    assert sampler_params(result)["guidance"] == FLUX_DEFAULT_GUIDANCE
    assert any("cfg 3 is ignored: FLUX.1 is guidance-distilled" in m
               for m in warnings_of(result, "6"))


def test_cfg_above_one_on_flux_is_ignored_with_a_warning():
    result = imported(flux_workflow(cfg=3.5))
    assert sampler_params(result)["guidance"] == 4.0
    assert any(m.startswith("cfg 3.5 is ignored") for m in warnings_of(result, "6"))


def test_model_sampling_flux_becomes_the_shift_of_its_size_even_from_primitives():
    doc = flux_workflow()
    doc["11"] = {"class_type": "ModelSamplingFlux", "inputs": {
        "model": ["1", 0], "max_shift": 1.15, "base_shift": 0.5, "width": ["12", 0],
        "height": 768}}
    doc["12"] = {"class_type": "PrimitiveInt", "inputs": {"value": 1344}}
    doc["6"]["inputs"]["model"] = ["11", 0]
    result = imported(doc)
    assert sampler_params(result)["shift"] == pytest.approx(flux_shift(1.15, 0.5, 1344, 768))
    assert sampler_params(result)["shift"] == pytest.approx(
        math.exp((1344 * 768 / 256) * (0.65 / 3840) + 0.5 - 0.65 / 3840 * 256))
    mapped = {e["id"]: e for e in result.report.to_wire()["mapped"]}
    assert mapped["11"]["into"] == ["6"] and mapped["11"]["param"] == "shift"


def test_the_nearest_model_sampling_node_wins_and_the_other_is_warned():
    doc = flux_workflow()
    doc["11"] = {"class_type": "ModelSamplingSD3", "inputs": {"model": ["1", 0], "shift": 5.0}}
    doc["12"] = {"class_type": "ModelSamplingAuraFlow", "inputs": {"model": ["11", 0],
                                                                   "shift": 2.0}}
    doc["6"]["inputs"]["model"] = ["12", 0]
    result = imported(doc)
    assert sampler_params(result)["shift"] == 2.0
    assert any("overridden by ModelSamplingAuraFlow 12" in m for m in warnings_of(result, "11"))


# --- Z-Image: cfg is its guidance; FluxGuidance means nothing to it ----------------------------


def test_flux_guidance_on_a_z_image_workflow_is_ignored_with_a_warning():
    ui = turbo_ui(ksampler=[1, "fixed", 8, 2.0, "euler", "simple", 1.0])
    ui.add(20, "FluxGuidance", [3.5], inputs=[("conditioning", "CONDITIONING")],
           outputs=["CONDITIONING"])
    ui.link(5, 0, 20, "conditioning").link(20, 0, 8, "positive")
    result = comfy_import(workflow=ui.doc(), catalog=ZIMAGE_CATALOG)
    assert result.graph.model_dump()["nodes"]["8"]["params"]["guidance"] == 1.0  # cfg 2 − 1
    assert any("not guidance-distilled" in m for m in warnings_of(result, "20"))


def test_model_sampling_aura_flow_sets_the_z_image_shift():
    ui = turbo_ui()
    ui.nodes[3]["widgets_values"] = [6.0]
    result = comfy_import(workflow=ui.doc(), catalog=ZIMAGE_CATALOG)
    assert result.graph.model_dump()["nodes"]["8"]["params"]["shift"] == 6.0


# --- KSamplerAdvanced -------------------------------------------------------------------------


def test_ksampler_advanced_on_flux_maps_its_step_window_and_warns_what_it_cannot_honour():
    doc = flux_workflow()
    doc["6"] = {"class_type": "KSamplerAdvanced", "inputs": {
        "model": ["1", 0], "positive": ["10", 0], "negative": ["4", 0], "latent_image": ["5", 0],
        "add_noise": "disable", "noise_seed": 3, "steps": 20, "cfg": 1.0,
        "sampler_name": "euler", "scheduler": "normal", "start_at_step": 5, "end_at_step": 15,
        "return_with_leftover_noise": "enable"}}
    result = imported(doc)
    assert result.graph.model_dump()["nodes"]["6"]["type"] == "sample/advanced"
    params = sampler_params(result)
    assert (params["seed"], params["steps"], params["denoise"], params["guidance"]) == (
        3, 20, 1.0, 4.0)
    assert (params["start_step"], params["end_step"], params["add_noise"],
            params["return_with_leftover_noise"]) == (5, 15, False, True)
    messages = " | ".join(warnings_of(result, "6"))
    assert "scheduler 'normal'" in messages and "end_at_step" not in messages


def test_a_ksampler_denoise_beyond_the_farm_s_steps_keeps_the_old_mapping_with_a_warning():
    doc = flux_workflow()
    doc["6"]["inputs"].update(steps=20, denoise=0.1)  # ComfyUI: 20 of a 200-step schedule
    result = imported(doc)
    assert (sampler_params(result)["steps"], sampler_params(result)["denoise"]) == (20, 0.1)
    assert any("schedule of 200 steps" in m for m in warnings_of(result, "6"))
    doc["6"]["inputs"].update(steps=20, denoise=0.5)
    assert (sampler_params(imported(doc))["steps"], sampler_params(imported(doc))["denoise"]) == (
        40, 0.5)


def test_model_sampling_flux_in_the_ui_format_reads_its_widgets_in_comfyuis_order():
    ui = turbo_ui()
    ui.node(4).update(type="ModelSamplingFlux", widgets_values=[1.15, 0.5, 1024, 1024])
    result = comfy_import(workflow=ui.doc(), catalog=ZIMAGE_CATALOG)
    shift = result.graph.model_dump()["nodes"]["8"]["params"]["shift"]
    assert shift == pytest.approx(math.exp(1.15))  # mu 1.15 at 1024², whatever the latent


# --- Qwen-Image: its CLIPLoader type, ModelSamplingAuraFlow, cfg ------------------------------

QWEN_CATALOG = {"diffusion_models": ["qwen_image_fp8_e4m3fn.safetensors"],
                "vae": ["qwen_image_vae.safetensors"],
                "text_encoders": ["qwen_2.5_vl_7b_fp8_scaled.safetensors"]}


def qwen_workflow() -> dict[str, Any]:
    """Qwen-Image as ComfyUI's template has it: UNETLoader, CLIPLoader type qwen_image,
    ModelSamplingAuraFlow 3.1, a positive and an empty negative, KSampler cfg 2.5."""
    return {
        "37": {"class_type": "UNETLoader", "inputs": {
            "unet_name": "qwen_image_fp8_e4m3fn.safetensors", "weight_dtype": "default"}},
        "38": {"class_type": "CLIPLoader", "inputs": {
            "clip_name": "qwen_2.5_vl_7b_fp8_scaled.safetensors", "type": "qwen_image",
            "device": "default"}},
        "39": {"class_type": "VAELoader", "inputs": {"vae_name": "qwen_image_vae.safetensors"}},
        "66": {"class_type": "ModelSamplingAuraFlow", "inputs": {"shift": 3.1, "model": ["37", 0]}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a fox", "clip": ["38", 0]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["38", 0]}},
        "58": {"class_type": "EmptySD3LatentImage", "inputs": {"width": 64, "height": 64,
                                                               "batch_size": 1}},
        "3": {"class_type": "KSampler", "inputs": {
            "model": ["66", 0], "positive": ["6", 0], "negative": ["7", 0],
            "latent_image": ["58", 0], "seed": 1, "steps": 20, "cfg": 2.5,
            "sampler_name": "euler", "scheduler": "simple", "denoise": 1.0}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["39", 0]}},
        "60": {"class_type": "SaveImage", "inputs": {"images": ["8", 0], "filename_prefix": "q"}},
    }


def test_a_qwen_image_workflow_maps_to_the_generic_nodes_with_its_cfg_and_shift():
    """The CLIPLoader's type `qwen_image` names the family (no file held yet); cfg c is the
    family's guidance c − 1 (its pipeline's true_cfg_scale is c); AuraFlow's shift passes on."""
    result = comfy_import(workflow=qwen_workflow(), catalog=QWEN_CATALOG)
    nodes = result.graph.model_dump()["nodes"]
    assert nodes["38"]["type"] == "load/text-encoder"
    assert nodes["38"]["params"]["file"] == "qwen_2.5_vl_7b_fp8_scaled.safetensors"
    assert (nodes["3"]["params"]["guidance"], nodes["3"]["params"]["shift"]) == (1.5, 3.1)
    assert not result.report.to_wire()["unmapped"]


def test_a_qwen_image_workflow_s_held_files_name_the_family_over_the_loader_type():
    files = {(folder, name): ("qwenimage",) for folder, names in QWEN_CATALOG.items()
             for name in names}
    doc = qwen_workflow()
    doc["38"]["inputs"]["type"] = "sd3"  # refused without the files (SD3 is not run)
    with pytest.raises(ImportInvalid):
        comfy_import(workflow=doc, catalog=QWEN_CATALOG)
    result = comfy_import(workflow=doc, catalog=QWEN_CATALOG, files=files)
    assert sampler_params(result, "3")["guidance"] == 1.5
    assert any("type 'sd3' is overruled: the weights of text_encoders/"
               "qwen_2.5_vl_7b_fp8_scaled.safetensors are qwenimage's" in m
               for m in warnings_of(result, "38"))


# --- Krea 2: its CLIPLoader type `krea2` (Qwen3-VL-4B), the Qwen-Image VAE, cfg ---------------

def test_a_krea2_workflow_maps_to_the_generic_nodes_with_its_cfg():
    """Krea 2 as ComfyUI ships it: UNETLoader, CLIPLoader type `krea2`, the Qwen-Image VAE,
    KSampler cfg 4.5 → the family's guidance 3.5 (its pipeline mixes cond + g·(cond − uncond));
    no Krea-2-only node is needed."""
    catalog = {"diffusion_models": ["krea2_raw_bf16.safetensors"],
               "vae": ["qwen_image_vae.safetensors"],
               "text_encoders": ["qwen3vl_4b_fp8_scaled.safetensors"]}
    doc = qwen_workflow()
    doc["37"]["inputs"]["unet_name"] = "krea2_raw_bf16.safetensors"
    doc["38"]["inputs"].update(clip_name="qwen3vl_4b_fp8_scaled.safetensors", type="krea2")
    doc["3"]["inputs"].update(model=["37", 0], cfg=4.5)
    del doc["66"]
    result = comfy_import(workflow=doc, catalog=catalog)
    nodes = result.graph.model_dump()["nodes"]
    assert nodes["38"]["type"] == "load/text-encoder"
    assert nodes["38"]["params"]["family"] == "krea2"  # the Qwen3-VL loads as Krea 2's encoder
    assert nodes["3"]["params"]["guidance"] == 3.5
    assert not result.report.to_wire()["unmapped"]
    assert not warnings_of(result, "38")
