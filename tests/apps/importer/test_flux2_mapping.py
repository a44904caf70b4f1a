"""FLUX.2 Klein workflows written the ComfyUI way (UI format): the family-typed CLIPLoader,
EmptyFlux2LatentImage and Flux2Scheduler map onto the farm's nodes."""

from __future__ import annotations

from typing import Any

from apps.importer.services import comfy_import
from tests.apps.importer.builder import Ui

MODEL, VAE, ENCODER = "flux-2-klein-4b.safetensors", "flux2-vae.safetensors", "qwen_3_4b.safetensors"
CATALOG = {"diffusion_models": [MODEL], "vae": [VAE], "text_encoders": [ENCODER]}
FILES = {("diffusion_models", MODEL): ("flux2",), ("vae", VAE): ("flux2",),
         ("text_encoders", ENCODER): ("zimage", "flux2")}


def klein_ui(*, model: str = MODEL, vae: str = VAE, encoder: str = ENCODER, prompt: str = "a fox",
             width: int = 1024, height: int = 1024, steps: int = 4, cfg: float = 1.0,
             seed: int = 42, reference: str | None = None) -> Ui:
    """FLUX.2 Klein text-to-image as ComfyUI's template lays it out: custom sampling with
    CFGGuider, EmptyFlux2LatentImage and Flux2Scheduler (the negative is the empty prompt).
    With `reference` (a LoadImage file), Klein editing: LoadImage → VAEEncode →
    ReferenceLatent on both prompts."""
    ui = Ui()
    ui.add(1, "UNETLoader", [model, "default"], outputs=["MODEL"])
    ui.add(2, "CLIPLoader", [encoder, "flux2", "default"], outputs=["CLIP"])
    ui.add(3, "VAELoader", [vae], outputs=["VAE"])
    for node_id, text in ((4, prompt), (5, "")):
        ui.add(node_id, "CLIPTextEncode", [text], inputs=[("clip", "CLIP")],
               outputs=["CONDITIONING"])
    ui.add(6, "CFGGuider", [cfg], inputs=[("model", "MODEL"), ("positive", "CONDITIONING"),
                                          ("negative", "CONDITIONING")], outputs=["GUIDER"])
    ui.add(7, "EmptyFlux2LatentImage", [width, height, 1], outputs=["LATENT"])
    ui.add(8, "Flux2Scheduler", [steps, width, height], outputs=["SIGMAS"])
    ui.add(9, "KSamplerSelect", ["euler"], outputs=["SAMPLER"])
    ui.add(10, "RandomNoise", [seed, "fixed"], outputs=["NOISE"])
    ui.add(11, "SamplerCustomAdvanced", [],
           inputs=[("noise", "NOISE"), ("guider", "GUIDER"), ("sampler", "SAMPLER"),
                   ("sigmas", "SIGMAS"), ("latent_image", "LATENT")],
           outputs=["LATENT", "LATENT"])
    ui.add(12, "VAEDecode", [], inputs=[("samples", "LATENT"), ("vae", "VAE")], outputs=["IMAGE"])
    ui.add(13, "SaveImage", ["klein"], inputs=[("images", "IMAGE")])
    (ui.link(1, 0, 6, "model").link(2, 0, 4, "clip").link(2, 0, 5, "clip")
       .link(4, 0, 6, "positive").link(5, 0, 6, "negative").link(10, 0, 11, "noise")
       .link(6, 0, 11, "guider").link(9, 0, 11, "sampler").link(8, 0, 11, "sigmas")
       .link(7, 0, 11, "latent_image").link(11, 0, 12, "samples").link(3, 0, 12, "vae")
       .link(12, 0, 13, "images"))
    if reference is not None:
        ui.add(20, "LoadImage", [reference, "image"], outputs=["IMAGE", "MASK"])
        ui.add(21, "VAEEncode", [], inputs=[("pixels", "IMAGE"), ("vae", "VAE")],
               outputs=["LATENT"])
        ui.link(20, 0, 21, "pixels").link(3, 0, 21, "vae")
        for node_id, prompt_node, port in ((22, 4, "positive"), (23, 5, "negative")):
            ui.add(node_id, "ReferenceLatent", [], inputs=[("conditioning", "CONDITIONING"),
                                                          ("latent", "LATENT")],
                   outputs=["CONDITIONING"])
            ui.link(prompt_node, 0, node_id, "conditioning").link(21, 0, node_id, "latent")
            ui.rewire(node_id, 0, 6, port)
    return ui


def nodes_of(doc: dict[str, Any]) -> dict[str, Any]:
    result = comfy_import(workflow=doc, catalog=CATALOG, files=FILES)
    assert not result.report.to_wire()["unmapped"], result.report.to_wire()
    return result.graph.model_dump()["nodes"]


def test_the_klein_template_imports_with_its_qwen3_loaded_as_flux2_s():
    nodes = nodes_of(klein_ui(cfg=5.0).doc())
    assert nodes["2"]["type"] == "load/text-encoder"
    assert nodes["2"]["params"]["family"] == "flux2"  # CLIPLoader type flux2, not Z-Image's
    assert nodes["7"]["type"] == "latent/empty"
    assert (nodes["7"]["params"]["width"], nodes["7"]["params"]["height"]) == (1024, 1024)
    assert nodes["6"]["type"] == "sampling/cfg-guider" and nodes["6"]["params"]["cfg"] == 5.0
    assert nodes["11"]["type"] == "sampling/custom-advanced"


def test_flux2_scheduler_keeps_its_steps_and_size():
    nodes = nodes_of(klein_ui(steps=4, width=64, height=48).doc())
    assert nodes["8"]["type"] == "flux2/scheduler"
    assert nodes["8"]["params"] == {"steps": 4, "width": 64, "height": 48}


def test_a_flux2_scheduler_s_wired_size_stays_wired():
    """ComfyUI's edit templates feed Flux2Scheduler the reference's size (GetImageSize)."""
    ui = klein_ui()
    ui.add(20, "PrimitiveInt", [512, "fixed"], outputs=["INT"])
    ui.node(8)["inputs"] = [{"name": "width", "type": "INT", "link": None,
                             "widget": {"name": "width"}}]
    ui.link(20, 0, 8, "width")
    nodes = nodes_of(ui.doc())
    assert nodes["8"]["inputs"]["width"]["node"] == "20"


def test_the_klein_edit_template_conditions_both_prompts_on_the_reference_latent():
    nodes = nodes_of(klein_ui(cfg=4.0, reference="cat.png").doc())
    assert (nodes["20"]["type"], nodes["20"]["params"]) == ("image/load", {"asset": "cat.png"})
    assert nodes["21"]["type"] == "vae/encode"
    for node_id, prompt in (("22", "4"), ("23", "5")):
        assert nodes[node_id]["type"] == "flux2/reference-latent"
        assert nodes[node_id]["inputs"] == {"conditioning": {"node": prompt, "port": "conditioning"},
                                            "latent": {"node": "21", "port": "latent"}}
    assert nodes["6"]["inputs"]["positive"] == {"node": "22", "port": "conditioning"}
    assert nodes["6"]["inputs"]["negative"] == {"node": "23", "port": "conditioning"}
