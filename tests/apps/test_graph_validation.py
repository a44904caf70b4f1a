"""Graph validation without a database: defaults, coercion, ordering."""

from __future__ import annotations

import pytest

from apps.graphs.schema import GraphDoc
from apps.graphs.validation import GraphInvalid, closure_order, graph_validate


def _doc(nodes):
    return GraphDoc.model_validate({"nodes": nodes})


def test_defaults_are_filled_in_and_the_hash_ignores_spelling_them_out():
    bare = _doc({"t": {"type": "input/text"}})
    spelled = _doc({"t": {"type": "input/text", "params": {"value": ""}}})
    a, b = graph_validate(bare, target="t"), graph_validate(spelled, target="t")
    assert a.nodes["t"].params == {"value": ""}
    assert a.sha256() == b.sha256()


def test_integral_floats_are_accepted_as_ints_but_booleans_are_not():
    ok = graph_validate(_doc({"n": {"type": "input/int", "params": {"value": 3.0}}}), target="n")
    assert ok.nodes["n"].params["value"] == 3
    with pytest.raises(GraphInvalid) as err:
        graph_validate(_doc({"n": {"type": "input/int", "params": {"value": True}}}), target="n")
    assert err.value.code == "param_type"


def test_image_sides_must_be_multiples_of_16():
    with pytest.raises(GraphInvalid) as err:
        graph_validate(_doc({"l": {"type": "latent/empty", "params": {"width": 100}}}), target="l")
    assert err.value.code == "param_range" and "multiple of 16" in err.value.message


def test_the_closure_is_in_topological_order_and_skips_unrelated_nodes():
    doc = graph_validate(_doc({
        "a": {"type": "input/image", "params": {"asset": "x"}},
        "b": {"type": "image/resize", "params": {"width": 1, "height": 1},
              "inputs": {"image": {"node": "a", "port": "image"}}},
        "c": {"type": "image/save", "inputs": {"image": {"node": "b", "port": "image"}}},
        "z": {"type": "input/text"},
    }), target="c")
    assert closure_order(doc, "c") == ["a", "b", "c"]


def test_an_empty_graph_is_refused():
    with pytest.raises(GraphInvalid) as err:
        graph_validate(_doc({}), target="x")
    assert err.value.code == "empty_graph"


def test_a_long_chain_validates_without_recursion_limits():
    nodes = {"n0": {"type": "input/image", "params": {"asset": "x"}}}
    for i in range(1, 3000):
        nodes[f"n{i}"] = {"type": "image/resize", "params": {"width": 8, "height": 8},
                          "inputs": {"image": {"node": f"n{i - 1}", "port": "image"}}}
    doc = graph_validate(_doc(nodes), target="n2999", max_nodes=5000)
    assert closure_order(doc, "n2999")[:2] == ["n0", "n1"]


def test_a_cycle_is_found_far_from_the_target():
    nodes = {"a": {"type": "image/resize", "params": {"width": 8, "height": 8},
                   "inputs": {"image": {"node": "b", "port": "image"}}},
             "b": {"type": "image/resize", "params": {"width": 8, "height": 8},
                   "inputs": {"image": {"node": "a", "port": "image"}}},
             "t": {"type": "input/text"}}
    with pytest.raises(GraphInvalid) as err:
        graph_validate(_doc(nodes), target="t")
    assert err.value.code == "cycle"
