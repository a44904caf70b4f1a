"""ComfyUI's custom-sampling nodes and KSampler's sampler / scheduler names through the importer
(API format, no database)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from apps.importer.report import ImportInvalid
from apps.importer.services import comfy_import
from tests.apps.importer.builder import CATALOG, Ui, workflow


def custom_advanced(sigmas: str = "1, 0.6, 0.3, 0") -> dict[str, Any]:
    """The Z-Image Turbo template with its KSampler replaced by SamplerCustomAdvanced parts."""
    api = copy.deepcopy(workflow("z_image_turbo.api.json"))
    del api["57:3"], api["57:33"]
    api.update({
        "n": {"class_type": "RandomNoise", "inputs": {"noise_seed": 11}},
        "g": {"class_type": "CFGGuider", "inputs": {"cfg": 2.0, "model": ["57:11", 0],
                                                    "positive": ["57:27", 0],
                                                    "negative": ["57:27", 0]}},
        "s": {"class_type": "KSamplerSelect", "inputs": {"sampler_name": "dpmpp_2m_sde"}},
        "m": {"class_type": "ManualSigmas", "inputs": {"sigmas": sigmas}},
        "c": {"class_type": "SamplerCustomAdvanced",
              "inputs": {"noise": ["n", 0], "guider": ["g", 0], "sampler": ["s", 0],
                         "sigmas": ["m", 0], "latent_image": ["57:13", 0]}},
    })
    api["57:8"]["inputs"]["samples"] = ["c", 0]
    return api


def test_sampler_custom_advanced_maps_to_its_parts():
    result = comfy_import(workflow=custom_advanced(), catalog=CATALOG)
    graph = result.graph.model_dump()["nodes"]
    assert graph["c"]["type"] == "sampling/custom-advanced"
    assert graph["c"]["inputs"]["sigmas"] == {"node": "m", "port": "sigmas"}
    assert graph["m"]["params"] == {"sigmas": "1, 0.6, 0.3, 0"}
    assert graph["s"]["params"] == {"sampler_name": "dpmpp_2m_sde"}
    assert graph["g"]["params"] == {"cfg": 2.0}
    assert graph["n"]["params"] == {"noise_seed": 11}
    assert graph["57:8"]["inputs"]["latent"] == {"node": "c", "port": "latent"}


def test_an_unknown_sampler_name_is_unmapped_with_the_names_the_farm_has():
    api = custom_advanced()
    api["s"]["inputs"]["sampler_name"] = "ddim"
    with pytest.raises(ImportInvalid) as err:  # the only output needs the unmapped node
        comfy_import(workflow=api, catalog=CATALOG)
    assert err.value.report is not None
    report = err.value.report.to_wire()
    unmapped = next(e for e in report["unmapped"] if e["id"] == "s")
    assert "'ddim' is not on this farm" in unmapped["reason"]


def test_a_dpmpp_2m_karras_ksampler_keeps_its_names_and_unknown_ones_warn():
    api = copy.deepcopy(workflow("z_image_turbo.api.json"))
    api["57:3"]["inputs"].update(sampler_name="dpmpp_2m", scheduler="karras")
    params = comfy_import(workflow=api, catalog=CATALOG).graph.model_dump()["nodes"]["57:3"]["params"]
    assert (params["sampler"], params["scheduler"]) == ("dpmpp_2m", "karras")
    api["57:3"]["inputs"].update(sampler_name="ddim", scheduler="ddim_uniform")
    result = comfy_import(workflow=api, catalog=CATALOG)
    params = result.graph.model_dump()["nodes"]["57:3"]["params"]
    assert (params["sampler"], params["scheduler"]) == ("default", "default")
    warnings = [w["message"] for w in result.report.to_wire()["warnings"] if w["id"] == "57:3"]
    assert any("'ddim' is not on this farm" in w for w in warnings)
    assert any("'ddim_uniform' is not on this farm" in w for w in warnings)


def test_object_info_describes_the_custom_sampling_types_as_comfyui_does():
    from apps.importer.comfy_object_info import object_info

    info = object_info(catalog=CATALOG, uploads=[])
    advanced = info["SamplerCustomAdvanced"]
    assert advanced["input"]["required"] == {
        "noise": ["NOISE"], "guider": ["GUIDER"], "sampler": ["SAMPLER"], "sigmas": ["SIGMAS"],
        "latent_image": ["LATENT"]}
    assert advanced["output"] == ["LATENT", "LATENT"]
    assert "dpmpp_2m_sde" in info["KSamplerSelect"]["input"]["required"]["sampler_name"][0]
    assert "karras" in info["BasicScheduler"]["input"]["required"]["scheduler"][0]
    assert info["SamplerCustom"]["input"]["required"]["add_noise"][0] == "BOOLEAN"
    assert info["RandomNoise"]["input"]["required"]["noise_seed"][1]["control_after_generate"]


def test_a_ui_workflow_with_sampler_custom_reads_its_widgets_in_comfyuis_order():
    ui = Ui()
    ui.add(1, "UNETLoader", ["z_image_turbo_bf16.safetensors", "default"], outputs=["MODEL"])
    ui.add(2, "CLIPLoader", ["qwen_3_4b.safetensors", "lumina2", "default"], outputs=["CLIP"])
    ui.add(3, "VAELoader", ["ae.safetensors"], outputs=["VAE"])
    ui.add(5, "CLIPTextEncode", ["a fox"], inputs=[("clip", "CLIP")], outputs=["CONDITIONING"])
    ui.add(7, "EmptySD3LatentImage", [512, 384, 1], outputs=["LATENT"])
    ui.add(11, "KSamplerSelect", ["heun"], outputs=["SAMPLER"])
    ui.add(12, "BasicScheduler", ["beta", 6, 0.8], inputs=[("model", "MODEL")],
           outputs=["SIGMAS"])
    ui.add(13, "SamplerCustom", [False, 99, "fixed", 2.5],
           inputs=[("model", "MODEL"), ("positive", "CONDITIONING"), ("negative", "CONDITIONING"),
                   ("sampler", "SAMPLER"), ("sigmas", "SIGMAS"), ("latent_image", "LATENT")],
           outputs=["LATENT", "LATENT"])
    ui.add(9, "VAEDecode", [], inputs=[("samples", "LATENT"), ("vae", "VAE")], outputs=["IMAGE"])
    ui.add(10, "SaveImage", ["fox"], inputs=[("images", "IMAGE")])
    (ui.link(1, 0, 13, "model").link(1, 0, 12, "model").link(2, 0, 5, "clip")
       .link(5, 0, 13, "positive").link(11, 0, 13, "sampler").link(12, 0, 13, "sigmas")
       .link(7, 0, 13, "latent_image").link(13, 1, 9, "samples").link(3, 0, 9, "vae")
       .link(9, 0, 10, "images"))
    graph = comfy_import(workflow=ui.doc(), catalog=CATALOG).graph.model_dump()["nodes"]
    assert graph["13"]["params"] == {"add_noise": False, "noise_seed": 99, "cfg": 2.5}
    assert graph["12"]["params"] == {"scheduler": "beta", "steps": 6, "denoise": 0.8}
    assert graph["11"]["params"] == {"sampler_name": "heun"}
    assert graph["9"]["inputs"]["latent"] == {"node": "13", "port": "denoised"}
