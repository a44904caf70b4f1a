"""The importer and model families: FLUX.1's two text encoders come in as one loader."""

from __future__ import annotations

from typing import Any

from apps.importer.services import comfy_import

CATALOG = {"diffusion_models": ["flux1-dev.safetensors"], "vae": ["ae.safetensors"],
           "text_encoders": ["clip_l.safetensors", "t5xxl_fp16.safetensors"]}


def flux_workflow(clip_type: str = "flux") -> dict[str, Any]:
    return {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": "flux1-dev.safetensors",
                                                     "weight_dtype": "default"}},
        "2": {"class_type": "DualCLIPLoader", "inputs": {
            "clip_name1": "clip_l.safetensors", "clip_name2": "t5xxl_fp16.safetensors",
            "type": clip_type, "device": "default"}},
        "3": {"class_type": "VAELoader", "inputs": {"vae_name": "ae.safetensors"}},
        "4": {"class_type": "CLIPTextEncode", "inputs": {"text": "a fox", "clip": ["2", 0]}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64,
                                                           "batch_size": 1}},
        "6": {"class_type": "KSampler", "inputs": {
            "model": ["1", 0], "positive": ["4", 0], "negative": ["4", 0], "latent_image": ["5", 0],
            "seed": 1, "steps": 4, "cfg": 1.0, "sampler_name": "euler", "scheduler": "simple",
            "denoise": 1.0}},
        "7": {"class_type": "VAEDecode", "inputs": {"samples": ["6", 0], "vae": ["3", 0]}},
        "8": {"class_type": "SaveImage", "inputs": {"images": ["7", 0], "filename_prefix": "f"}},
    }


def test_a_dual_clip_loader_becomes_one_text_encoder_loader_with_both_files():
    result = comfy_import(workflow=flux_workflow(), catalog=CATALOG)
    loader = result.graph.model_dump()["nodes"]["2"]
    assert loader["type"] == "load/text-encoder"
    assert loader["params"] == {"file": "clip_l.safetensors", "file_2": "t5xxl_fp16.safetensors"}
    assert not [w for w in result.report.to_wire()["warnings"] if w["id"] == "2"]


def test_a_dual_clip_loader_of_another_type_is_mapped_with_a_warning():
    result = comfy_import(workflow=flux_workflow("sd3"), catalog=CATALOG)
    warnings = [w["message"] for w in result.report.to_wire()["warnings"] if w["id"] == "2"]
    assert warnings and "FLUX.1" in warnings[0]


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
