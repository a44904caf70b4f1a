"""A LoRA at submit: the catalog's family of a `loras/` file (recognised from its keys) must be
the model's; another family's LoRA is a 422 naming the load/lora node and both families."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from apps.fleet.models import Worker
from apps.graphs.schema import GraphDoc
from apps.graphs.validation import GraphInvalid
from apps.runs.services import run_submit
from tests.apps.test_model_families import FILES, chain

pytestmark = pytest.mark.django_db


@pytest.fixture
def artist() -> Any:
    files = {**FILES, ("loras", "flux-style.safetensors"): ("flux1", "lora", ["flux1"])}
    Worker.objects.create(
        name="cpu@host", queues=["cpu"], state="online", last_heartbeat=timezone.now(), slots=2,
        device={"profile": "cpu"},
        model_files=[{"folder": folder, "name": name, "kind": "file", "size": 1000,
                      "family": family, "role": role, "families": families}
                     for (folder, name), (family, role, families) in files.items()])
    return get_user_model().objects.create(username="artist")


def with_lora(graph: GraphDoc, lora: str) -> GraphDoc:
    doc = graph.model_dump()
    doc["nodes"]["lora"] = {"type": "load/lora", "params": {"lora": lora, "strength": 0.8},
                            "inputs": {"model": {"node": "unet", "port": "model"}}}
    doc["nodes"]["sample"]["inputs"]["model"] = {"node": "lora", "port": "model"}
    return GraphDoc.model_validate(doc)


def test_a_flux_lora_on_a_flux_model_submits(artist):
    graph = with_lora(chain("flux1-dev.safetensors", "ae.safetensors", "t5xxl.safetensors",
                            "clip_l.safetensors"), "flux-style.safetensors")
    run, created = run_submit(owner=artist, graph=graph, target="save")
    assert created and run.requirement["families"] == ["flux1"]
    # routing holds the LoRA file like any model file: only its holders, its size in the need
    assert {"folder": "loras", "name": "flux-style.safetensors"} in run.requirement["models"]


def test_a_flux_lora_on_a_z_image_model_is_refused_naming_the_lora_node(artist):
    graph = with_lora(chain("z_image_turbo.safetensors", "ae.safetensors", "qwen_3_4b"),
                      "flux-style.safetensors")
    with pytest.raises(GraphInvalid) as refused:
        run_submit(owner=artist, graph=graph, target="save")
    assert (refused.value.code, refused.value.node_id) == ("family_mismatch", "lora")
    assert "flux1" in refused.value.message and "zimage" in refused.value.message


def with_clip_lora(graph: GraphDoc, lora: str, *, wire_encoder: bool) -> GraphDoc:
    doc = with_lora(graph, lora).model_dump()
    doc["nodes"]["lora"]["params"]["strength_clip"] = 0.5
    if wire_encoder:
        doc["nodes"]["lora"]["inputs"]["encoder"] = {"node": "clip", "port": "encoder"}
    doc["nodes"]["pos"]["inputs"]["encoder"] = {"node": "lora", "port": "encoder"}
    return GraphDoc.model_validate(doc)


def test_a_lora_s_text_encoder_half_submits_wired_between_the_encoder_and_its_encodes(artist):
    graph = with_clip_lora(chain("flux1-dev.safetensors", "ae.safetensors", "t5xxl.safetensors",
                                 "clip_l.safetensors"), "flux-style.safetensors",
                           wire_encoder=True)
    run, created = run_submit(owner=artist, graph=graph, target="save")
    assert created and run.graph.document["nodes"]["lora"]["params"]["strength_clip"] == 0.5


def test_reading_the_lora_node_s_encoder_without_wiring_one_in_is_refused_naming_it(artist):
    graph = with_clip_lora(chain("flux1-dev.safetensors", "ae.safetensors", "t5xxl.safetensors",
                                 "clip_l.safetensors"), "flux-style.safetensors",
                           wire_encoder=False)
    with pytest.raises(GraphInvalid) as refused:
        run_submit(owner=artist, graph=graph, target="save")
    assert (refused.value.code, refused.value.node_id) == ("missing_input", "lora")
    assert "'encoder'" in refused.value.message and "'pos'" in refused.value.message
