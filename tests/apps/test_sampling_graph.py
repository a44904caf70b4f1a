"""Sampling as parts at submit: the ports' kinds (noise, sampler, sigmas, guider) and the names
are checked before a run exists, naming the node (no database)."""

from __future__ import annotations

from typing import Any

import pytest

from apps.graphs.schema import GraphDoc
from apps.graphs.validation import GraphInvalid, graph_validate


def custom_graph(**changes: dict[str, Any]) -> dict[str, Any]:
    nodes: dict[str, Any] = {
        "m": {"type": "load/diffusion-model", "params": {"file": "z.safetensors"}},
        "e": {"type": "load/text-encoder", "params": {"file": "q"}},
        "p": {"type": "encode/text", "params": {"text": "a fox"},
              "inputs": {"encoder": {"node": "e", "port": "encoder"}}},
        "l": {"type": "latent/empty", "params": {"width": 64, "height": 64}},
        "n": {"type": "sampling/noise", "params": {"noise_seed": 5}},
        "g": {"type": "sampling/guider", "inputs": {"model": {"node": "m", "port": "model"},
                                                    "conditioning": {"node": "p",
                                                                     "port": "conditioning"}}},
        "s": {"type": "sampling/sampler", "params": {"sampler_name": "dpmpp_2m"}},
        "k": {"type": "sampling/scheduler", "params": {"scheduler": "karras", "steps": 6},
              "inputs": {"model": {"node": "m", "port": "model"}}},
        "c": {"type": "sampling/custom-advanced", "inputs": {
            "noise": {"node": "n", "port": "noise"}, "guider": {"node": "g", "port": "guider"},
            "sampler": {"node": "s", "port": "sampler"}, "sigmas": {"node": "k", "port": "sigmas"},
            "latent": {"node": "l", "port": "latent"}}},
    }
    for node, change in changes.items():
        nodes[node] = {**nodes.get(node, {}), **change}
    return nodes


def refusal(nodes: dict[str, Any]) -> GraphInvalid:
    with pytest.raises(GraphInvalid) as err:
        graph_validate(GraphDoc.model_validate({"nodes": nodes}), target="c")
    return err.value


def test_a_whole_custom_sampler_graph_validates_with_its_defaults():
    doc = graph_validate(GraphDoc.model_validate({"nodes": custom_graph()}), target="c")
    assert doc.nodes["k"].params == {"scheduler": "karras", "steps": 6, "denoise": 1.0}


def test_a_sampler_wired_where_sigmas_go_is_a_kind_mismatch_naming_the_node():
    wrong = custom_graph(c={"inputs": {**custom_graph()["c"]["inputs"],
                                       "sigmas": {"node": "s", "port": "sampler"}}})
    err = refusal(wrong)
    assert (err.code, err.node_id) == ("kind_mismatch", "c")


def test_a_custom_sampler_without_its_guider_names_the_missing_input():
    inputs = {k: v for k, v in custom_graph()["c"]["inputs"].items() if k != "guider"}
    err = refusal(custom_graph(c={"inputs": inputs}))
    assert (err.code, err.node_id) == ("missing_input", "c") and "guider" in err.message


@pytest.mark.parametrize(("node", "params"), [("s", {"sampler_name": "ddim"}),
                                              ("k", {"scheduler": "ddim_uniform"})])
def test_a_name_the_farm_lacks_is_refused_naming_the_node(node, params):
    err = refusal(custom_graph(**{node: {"params": params}}))
    assert err.node_id == node and next(iter(params.values())) in err.message


def test_a_guider_and_sigmas_of_two_families_are_a_family_mismatch_at_the_custom_sampler():
    from apps.graphs.families import ModelFile, graph_families_check
    from apps.graphs.validation import closure_order

    files = {("diffusion_models", name): ModelFile("diffusion_models", name, family,
                                                   "transformer", (family,), 1)
             for name, family in (("z.safetensors", "zimage"), ("f.safetensors", "flux1"))}
    nodes = custom_graph(f={"type": "load/diffusion-model", "params": {"file": "f.safetensors"}},
                         k={"inputs": {"model": {"node": "f", "port": "model"}}})
    doc = graph_validate(GraphDoc.model_validate({"nodes": nodes}), target="c")
    with pytest.raises(GraphInvalid) as err:
        graph_families_check(doc, closure_order(doc, "c"), files)
    assert (err.value.code, err.value.node_id) == ("family_mismatch", "c")
    assert "zimage" in err.value.message and "flux1" in err.value.message
    same = graph_validate(GraphDoc.model_validate({"nodes": custom_graph()}), target="c")
    assert graph_families_check(same, closure_order(same, "c"), files) == {"zimage"}
