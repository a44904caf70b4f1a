"""A tiny builder of ComfyUI UI-format workflows for the importer's tests."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

WORKFLOWS = Path(__file__).parent / "workflows"
CATALOG = {"diffusion_models": ["z_image_turbo_bf16.safetensors"], "text_encoders": ["qwen_3_4b"],
           "vae": ["ae.safetensors"]}


def workflow(name: str) -> Any:
    return json.loads((WORKFLOWS / name).read_text())


class Ui:
    """Nodes with typed input slots; `link` wires an output slot to a named input."""

    def __init__(self) -> None:
        self.nodes: list[dict[str, Any]] = []
        self.links: list[list[Any]] = []
        self.subgraphs: list[dict[str, Any]] = []

    def add(self, node_id: int, node_type: str, widgets: Any = (), *, inputs: Any = (),
            outputs: Any = (), mode: int = 0, **extra: Any) -> Ui:
        slots = []
        for spec in inputs:
            name, kind, *rest = spec
            slot: dict[str, Any] = {"name": name, "type": kind, "link": None}
            if rest and rest[0]:
                slot["widget"] = {"name": name}
            slots.append(slot)
        self.nodes.append({
            "id": node_id, "type": node_type, "mode": mode, "inputs": slots,
            "outputs": [{"name": o, "type": o, "links": []} for o in outputs],
            "widgets_values": list(widgets) if isinstance(widgets, list | tuple) else widgets,
            "properties": {}, **extra,
        })
        return self

    def node(self, node_id: int) -> dict[str, Any]:
        return next(n for n in self.nodes if n["id"] == node_id)

    def link(self, origin: int, slot: int, target: int, input_name: str) -> Ui:
        link_id = len(self.links) + 1
        consumer = self.node(target)
        index, entry = next((i, s) for i, s in enumerate(consumer["inputs"])
                            if s["name"] == input_name)
        entry["link"] = link_id
        self.node(origin)["outputs"][slot]["links"].append(link_id)
        self.links.append([link_id, origin, slot, target, index, entry["type"]])
        return self

    def rewire(self, origin: int, slot: int, target: int, input_name: str) -> Ui:
        """Point an already linked input at another output."""
        entry = next(s for s in self.node(target)["inputs"] if s["name"] == input_name)
        link = next(ln for ln in self.links if ln[0] == entry["link"])
        link[1], link[2] = origin, slot
        return self

    def doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"last_node_id": 99, "last_link_id": len(self.links),
                               "nodes": copy.deepcopy(self.nodes), "links": self.links,
                               "groups": [], "config": {}, "extra": {}, "version": 0.4}
        if self.subgraphs:
            doc["definitions"] = {"subgraphs": self.subgraphs}
        return doc


def turbo_ui(*, ksampler: Any = (42, "randomize", 8, 1, "euler", "simple", 1)) -> Ui:
    """The Z-Image Turbo text-to-image workflow, flat (no subgraph)."""
    ui = Ui()
    ui.add(1, "UNETLoader", ["z_image_turbo_bf16.safetensors", "default"], outputs=["MODEL"])
    ui.add(2, "CLIPLoader", ["qwen_3_4b.safetensors", "lumina2", "default"], outputs=["CLIP"])
    ui.add(3, "VAELoader", ["ae.safetensors"], outputs=["VAE"])
    ui.add(4, "ModelSamplingAuraFlow", [3], inputs=[("model", "MODEL")], outputs=["MODEL"])
    ui.add(5, "CLIPTextEncode", ["a fox in the snow"], inputs=[("clip", "CLIP"),
                                                               ("text", "STRING", True)],
           outputs=["CONDITIONING"])
    ui.add(6, "ConditioningZeroOut", [], inputs=[("conditioning", "CONDITIONING")],
           outputs=["CONDITIONING"])
    ui.add(7, "EmptySD3LatentImage", [512, 384, 1], outputs=["LATENT"])
    ui.add(8, "KSampler", list(ksampler),
           inputs=[("model", "MODEL"), ("positive", "CONDITIONING"), ("negative", "CONDITIONING"),
                   ("latent_image", "LATENT"), ("seed", "INT", True)],
           outputs=["LATENT"])
    ui.add(9, "VAEDecode", [], inputs=[("samples", "LATENT"), ("vae", "VAE")], outputs=["IMAGE"])
    ui.add(10, "SaveImage", ["fox"], inputs=[("images", "IMAGE")])
    (ui.link(1, 0, 4, "model").link(4, 0, 8, "model").link(2, 0, 5, "clip")
       .link(5, 0, 8, "positive").link(5, 0, 6, "conditioning").link(6, 0, 8, "negative")
       .link(7, 0, 8, "latent_image").link(8, 0, 9, "samples").link(3, 0, 9, "vae")
       .link(9, 0, 10, "images"))
    return ui


def bomb(levels: int, fanout: int, copies: int = 1) -> dict[str, Any]:
    """A UI workflow of `copies` instances of subgraph `sgN`, which holds `fanout` instances of
    `sgN-1` (N = 1..levels); `sg0` holds one PrimitiveInt. Flattened: copies × fanout**levels
    primitives, from a few KB."""
    subgraphs = [{"id": "sg0", "name": "sg0", "inputs": [], "outputs": [], "links": [],
                  "nodes": [{"id": 1, "type": "PrimitiveInt", "widgets_values": [1]}]}]
    for level in range(1, levels + 1):
        subgraphs.append({"id": f"sg{level}", "name": f"sg{level}", "inputs": [], "outputs": [],
                          "links": [], "nodes": [{"id": i, "type": f"sg{level - 1}"}
                                                 for i in range(1, fanout + 1)]})
    return {"nodes": [{"id": i, "type": f"sg{levels}"} for i in range(1, copies + 1)],
            "links": [],
            "definitions": {"subgraphs": subgraphs}}


BRANCHES = {  # a subgraph: the image, scaled by 0.5 (on_true) or inverted (on_false)
    "id": "branch-sub", "name": "Branches",
    "inputs": [{"name": "image", "type": "IMAGE"}, {"name": "switch", "type": "BOOLEAN"}],
    "outputs": [{"name": "IMAGE", "type": "IMAGE"}],
    "nodes": [
        {"id": 1, "type": "ImageScaleBy", "mode": 0, "widgets_values": ["nearest-exact", 0.5],
         "inputs": [{"name": "image", "type": "IMAGE", "link": 1}],
         "outputs": [{"name": "IMAGE", "type": "IMAGE", "links": [4]}]},
        {"id": 2, "type": "ImageInvert", "mode": 0, "widgets_values": [],
         "inputs": [{"name": "image", "type": "IMAGE", "link": 2}],
         "outputs": [{"name": "IMAGE", "type": "IMAGE", "links": [5]}]},
        {"id": 3, "type": "ComfySwitchNode", "mode": 0, "widgets_values": [False],
         "inputs": [{"name": "switch", "type": "BOOLEAN", "link": 3, "widget": {"name": "switch"}},
                    {"name": "on_false", "type": "*", "link": 5},
                    {"name": "on_true", "type": "*", "link": 4}],
         "outputs": [{"name": "output", "type": "*", "links": [6]}]},
    ],
    "links": [
        {"id": 1, "origin_id": -10, "origin_slot": 0, "target_id": 1, "target_slot": 0,
         "type": "IMAGE"},
        {"id": 2, "origin_id": -10, "origin_slot": 0, "target_id": 2, "target_slot": 0,
         "type": "IMAGE"},
        {"id": 3, "origin_id": -10, "origin_slot": 1, "target_id": 3, "target_slot": 0,
         "type": "BOOLEAN"},
        {"id": 4, "origin_id": 1, "origin_slot": 0, "target_id": 3, "target_slot": 2,
         "type": "IMAGE"},
        {"id": 5, "origin_id": 2, "origin_slot": 0, "target_id": 3, "target_slot": 1,
         "type": "IMAGE"},
        {"id": 6, "origin_id": 3, "origin_slot": 0, "target_id": -20, "target_slot": 0,
         "type": "IMAGE"},
    ],
}


def switch_ui(*, flag: bool = True, base: int = 32, steps: int = 8) -> Ui:
    """Z-Image Turbo written the ComfyUI way around a switch: the latent's width is a math
    expression of a PrimitiveInt (`a * 2`, over the widget's 512), the decoded image goes into a
    subgraph that switches, by a PrimitiveBoolean, between ImageScaleBy 0.5 (true) and
    ImageInvert (false), then SaveImage; a PreviewAny shows the computed width."""
    ui = turbo_ui(ksampler=(42, "fixed", steps, 1, "euler", "simple", 1))
    ui.node(7)["inputs"] = [{"name": "width", "type": "INT", "link": None,
                             "widget": {"name": "width"}}]
    ui.node(7)["widgets_values"] = [512, 48, 1]
    ui.add(11, "PrimitiveInt", [base, "fixed"], outputs=["INT"])
    ui.add(12, "ComfyMathExpression", ["a * 2"], inputs=[("values.a", "INT")],
           outputs=["FLOAT", "INT", "BOOLEAN"])
    ui.add(13, "PrimitiveBoolean", [flag], outputs=["BOOLEAN"])
    ui.add(20, "branch-sub", [], inputs=[("image", "IMAGE"), ("switch", "BOOLEAN")],
           outputs=["IMAGE"])
    ui.add(21, "PreviewAny", [], inputs=[("source", "*")])
    ui.subgraphs.append(copy.deepcopy(BRANCHES))
    save = ui.node(10)
    ui.links = [ln for ln in ui.links if ln[3] != 10]  # the decode → save link goes
    ui.node(9)["outputs"][0]["links"] = []
    save["inputs"][0]["link"] = None
    (ui.link(11, 0, 12, "values.a").link(12, 1, 7, "width").link(9, 0, 20, "image")
       .link(13, 0, 20, "switch").link(20, 0, 10, "images").link(12, 1, 21, "source"))
    return ui


def switch_api(*, flag: bool = True, base: int = 32, steps: int = 8) -> dict[str, Any]:
    """`switch_ui` as ComfyUI's API export writes it (subgraph nodes as `20:<id>`)."""
    return {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": "z_image_turbo_bf16.safetensors",
                                                     "weight_dtype": "default"}},
        "2": {"class_type": "CLIPLoader", "inputs": {"clip_name": "qwen_3_4b.safetensors",
                                                     "type": "lumina2", "device": "default"}},
        "3": {"class_type": "VAELoader", "inputs": {"vae_name": "ae.safetensors"}},
        "4": {"class_type": "ModelSamplingAuraFlow", "inputs": {"model": ["1", 0], "shift": 3}},
        "5": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["2", 0],
                                                         "text": "a fox in the snow"}},
        "6": {"class_type": "ConditioningZeroOut", "inputs": {"conditioning": ["5", 0]}},
        "7": {"class_type": "EmptySD3LatentImage", "inputs": {"width": ["12", 1], "height": 48,
                                                              "batch_size": 1}},
        "8": {"class_type": "KSampler", "inputs": {
            "seed": 42, "steps": steps, "cfg": 1, "sampler_name": "euler", "scheduler": "simple",
            "denoise": 1, "model": ["4", 0], "positive": ["5", 0], "negative": ["6", 0],
            "latent_image": ["7", 0]}},
        "9": {"class_type": "VAEDecode", "inputs": {"samples": ["8", 0], "vae": ["3", 0]}},
        "10": {"class_type": "SaveImage", "inputs": {"images": ["20:3", 0],
                                                     "filename_prefix": "fox"}},
        "11": {"class_type": "PrimitiveInt", "inputs": {"value": base}},
        "12": {"class_type": "ComfyMathExpression", "inputs": {"expression": "a * 2",
                                                               "values.a": ["11", 0]}},
        "13": {"class_type": "PrimitiveBoolean", "inputs": {"value": flag}},
        "20:1": {"class_type": "ImageScaleBy", "inputs": {"image": ["9", 0],
                                                          "upscale_method": "nearest-exact",
                                                          "scale_by": 0.5}},
        "20:2": {"class_type": "ImageInvert", "inputs": {"image": ["9", 0]}},
        "20:3": {"class_type": "ComfySwitchNode", "inputs": {
            "switch": ["13", 0], "on_false": ["20:2", 0], "on_true": ["20:1", 0]}},
        "21": {"class_type": "PreviewAny", "inputs": {"source": ["12", 1]}},
    }
