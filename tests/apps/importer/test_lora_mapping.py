"""ComfyUI's LoRA loaders → load/lora: LoraLoaderModelOnly, LoraLoader (its CLIP input and
output are load/lora's text encoder, its strength_clip the text-encoder half's strength) and
stacked chains."""

from __future__ import annotations

from typing import Any

from apps.importer.services import comfy_import
from tests.apps.importer.builder import CATALOG, turbo_ui

LORAS = {**CATALOG, "loras": ["style.safetensors", "detail.safetensors"]}


def imported(doc: Any) -> Any:
    return comfy_import(workflow=doc, catalog=LORAS)


def graph(result: Any) -> dict[str, Any]:
    return result.graph.model_dump()["nodes"]


def test_a_stack_of_lora_loaders_becomes_a_chain_of_load_lora_nodes():
    ui = turbo_ui()
    ui.add(12, "LoraLoaderModelOnly", ["style.safetensors", 0.8], inputs=[("model", "MODEL")],
           outputs=["MODEL"])
    ui.add(13, "LoraLoaderModelOnly", ["detail.safetensors", -0.5], inputs=[("model", "MODEL")],
           outputs=["MODEL"])
    ui.link(1, 0, 12, "model").link(12, 0, 13, "model").rewire(13, 0, 4, "model")
    result = imported(ui.doc())
    nodes = graph(result)
    assert nodes["12"]["type"] == nodes["13"]["type"] == "load/lora"
    assert nodes["12"]["params"] == {"lora": "style.safetensors", "strength": 0.8,
                                     "strength_clip": 1.0}  # the default: no encoder wired
    assert nodes["13"]["params"] == {"lora": "detail.safetensors", "strength": -0.5,
                                     "strength_clip": 1.0}
    assert nodes["12"]["inputs"]["model"] == {"node": "1", "port": "model"}
    assert nodes["13"]["inputs"]["model"] == {"node": "12", "port": "model"}
    assert nodes["8"]["inputs"]["model"] == {"node": "13", "port": "model"}
    assert result.report.unmapped == []


def test_lora_loader_s_clip_goes_through_the_lora_node_at_its_strength_clip():
    ui = turbo_ui()
    ui.add(12, "LoraLoader", ["style.safetensors", 1.0, 0.7],
           inputs=[("model", "MODEL"), ("clip", "CLIP")], outputs=["MODEL", "CLIP"])
    ui.link(1, 0, 12, "model").link(2, 0, 12, "clip").rewire(12, 0, 4, "model")
    ui.rewire(12, 1, 5, "clip")
    result = imported(ui.doc())
    nodes = graph(result)
    assert nodes["12"]["type"] == "load/lora"
    assert nodes["12"]["params"] == {"lora": "style.safetensors", "strength": 1.0,
                                     "strength_clip": 0.7}
    assert nodes["12"]["inputs"] == {"model": {"node": "1", "port": "model"},
                                     "encoder": {"node": "2", "port": "encoder"}}
    assert nodes["5"]["inputs"]["encoder"] == {"node": "12", "port": "encoder"}
    assert nodes["8"]["inputs"]["model"] == {"node": "12", "port": "model"}
    assert result.report.unmapped == []
    assert [w for w in result.report.warnings if w["id"] == "12"] == []


def test_a_stack_of_lora_loaders_chains_both_the_model_and_the_text_encoder():
    ui = turbo_ui()
    ui.add(12, "LoraLoader", ["style.safetensors", 1.0, 0.5],
           inputs=[("model", "MODEL"), ("clip", "CLIP")], outputs=["MODEL", "CLIP"])
    ui.add(13, "LoraLoader", ["detail.safetensors", 0.6, 0],
           inputs=[("model", "MODEL"), ("clip", "CLIP")], outputs=["MODEL", "CLIP"])
    ui.link(1, 0, 12, "model").link(2, 0, 12, "clip").link(12, 0, 13, "model")
    ui.link(12, 1, 13, "clip").rewire(13, 0, 4, "model").rewire(13, 1, 5, "clip")
    nodes = graph(imported(ui.doc()))
    assert nodes["13"]["inputs"] == {"model": {"node": "12", "port": "model"},
                                     "encoder": {"node": "12", "port": "encoder"}}
    assert nodes["13"]["params"]["strength_clip"] == 0
    assert nodes["5"]["inputs"]["encoder"] == {"node": "13", "port": "encoder"}
