"""ComfyUI's shipped Krea 2 Turbo workflow (image_krea2_turbo_t2i: its LLM prompt enhancer,
TextGenerate, switched on) imports onto `text/generate` and renders on the tiny Krea 2 stack:
the enhancer writes the prompt the sampler's encoder reads (gibberish from a random model)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from apps.importer.services import comfy_import
from tests.workers.vocab_helpers import done_nodes, render

STEPS, TOKENS = 2, 12


@pytest.fixture(scope="module")
def krea(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[str, str]]:
    from workers.models.krea2.plugin import write_tiny_stack

    models_dir = tmp_path_factory.mktemp("krea2-import-models")
    return models_dir, write_tiny_stack(models_dir)


def shipped_with(held: dict[str, str]) -> dict[str, Any]:
    """The shipped workflow with the tiny stack's files, 2 steps, 12 new tokens, 0.1 MP."""
    from apps.importer.comfy_templates import shipped_file

    workflow = json.loads(shipped_file("image_krea2_turbo_t2i.json") or b"{}")
    [subgraph] = workflow["definitions"]["subgraphs"]
    instance = next(n for n in workflow["nodes"] if n["type"] == subgraph["id"])
    names = [i["name"] for i in subgraph["inputs"]]  # the instance's values, in this order
    values = instance["widgets_values"]
    assert values[names.index("value_1")] is True  # the enhancer is on as shipped
    for name, value in (("max_length_1", TOKENS), ("unet_name", held["model"]),
                        ("clip_name", held["text_encoder"]), ("vae_name", held["vae"])):
        values[names.index(name)] = value
    sampler = next(n for n in subgraph["nodes"] if n["type"] == "KSampler")
    sampler["widgets_values"][2] = STEPS
    size = next(n for n in workflow["nodes"] if n["type"] == "ResolutionSelector")
    size["widgets_values"][1] = 0.1  # megapixels: its least
    return workflow


@pytest.mark.django_db
def test_comfyuis_shipped_krea_2_turbo_template_renders_with_its_prompt_enhancer(
    krea, settings, tmp_path
):
    models_dir, held = krea
    settings.INLINE_BLOB_DIR, settings.INLINE_MODELS_DIR = tmp_path / "blobs", models_dir
    catalog = {"diffusion_models": [held["model"]], "text_encoders": [held["text_encoder"]],
               "vae": [held["vae"]]}
    files = {("diffusion_models", held["model"]): ("krea2",),
             ("text_encoders", held["text_encoder"]): ("krea2", "qwenimage21"),
             ("vae", held["vae"]): ("krea2",)}
    result = comfy_import(workflow=shipped_with(held), catalog=catalog, files=files)
    nodes = result.graph.model_dump()["nodes"]
    enhancer = nodes["30:16"]
    assert enhancer["type"] == "text/generate"
    assert enhancer["params"] | {"max_length": TOKENS, "sampling": "on", "temperature": 0.7,
                                 "top_k": 64, "top_p": 0.95, "min_p": 0.05,
                                 "repetition_penalty": 1.05, "seed": 0,
                                 "use_default_template": True} == enhancer["params"]
    assert enhancer["inputs"]["encoder"] == {"node": "30:11", "port": "encoder"}
    assert {"id": "30:16", "type": "TextGenerate", "as": "text/generate"} in result.report.mapped
    assert result.report.unmapped == []
    outcome, run = render(nodes, result.target)
    assert outcome.status == "succeeded", outcome.error
    assert "30:16" in done_nodes(run)  # the enhancer ran: its text is the prompt encoded
    assert run.takes.count() == 1
    [shown] = [v for v in outcome.values if v.get("nodeId") == "30:20"]
    assert isinstance(shown["value"], str) and shown["value"]
