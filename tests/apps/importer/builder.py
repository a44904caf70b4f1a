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
