"""The math expression node's evaluator (apps/graphs/mathexpr.py) and its checks at submit: what
ComfyUI's ComfyMathExpression computes, and everything that is not arithmetic refused."""

from __future__ import annotations

from typing import Any

import pytest

from apps.graphs.mathexpr import ExpressionError, expression_evaluate
from apps.graphs.schema import GraphDoc
from apps.graphs.validation import GraphInvalid, graph_validate
from workers.runners import logic  # noqa: F401  (registers the runners)
from workers.runners.base import RUNNERS, NodeFailed


@pytest.mark.parametrize(("expression", "names", "result"), [
    ("a + b", {"a": 2, "b": 3.5}, 5.5),
    ("max(a, 512) // 16 * 16", {"a": 700}, 688),
    ("round(a / 3)", {"a": 10}, 3),
    ("floor(a * 1.5) + ceil(b)", {"a": 3, "b": 0.2}, 5),
    ("min(values)", {"a": 4, "b": -1, "c": 9}, -1),
    ("sum(values) / len", {"a": 1}, None),  # `len` is no known name: refused below
    ("a > b and a or b", {"a": 7, "b": 3}, 7),
    ("1 if a == b else -1", {"a": 2, "b": 2.0}, 1),
    ("not a", {"a": 0}, True),
    ("2 ** 10 % 1000", {}, 24),
    ("abs(-a) + sqrt(16)", {"a": 3}, 7.0),
])
def test_the_evaluator_computes_what_comfyui_computes(expression, names, result):
    if result is None:
        with pytest.raises(ExpressionError):
            expression_evaluate(expression, names)
        return
    assert expression_evaluate(expression, names) == result


@pytest.mark.parametrize("expression", [
    "__import__('os').system('id')",
    "a.__class__.__mro__",
    "(1).real",
    "open('/etc/passwd')",
    "[x for x in values]",
    "lambda: 1",
    "'text' * 3",
    "values[0]",
    "max(a, key=abs)",
    "eval('1')",
    "globals()",
    "a := 3",
    "-" * 200 + "1",  # nested past the depth limit
    "",
])
def test_anything_but_arithmetic_is_refused_at_submit_naming_the_node(expression):
    doc = GraphDoc.model_validate({"nodes": {
        "n": {"type": "input/int", "params": {"value": 1}},
        "m": {"type": "math/expression", "params": {"expression": expression},
              "inputs": {"a": {"node": "n", "port": "value"}}},
    }})
    with pytest.raises(GraphInvalid) as err:
        graph_validate(doc, target="m")
    assert err.value.code == "bad_expression" and err.value.node_id == "m"


def test_an_input_the_expression_reads_must_be_connected():
    doc = GraphDoc.model_validate({"nodes": {"m": {"type": "math/expression",
                                                   "params": {"expression": "a + q"}}}})
    with pytest.raises(GraphInvalid) as err:
        graph_validate(doc, target="m")
    assert err.value.code == "bad_expression" and "a, q" in err.value.message


@pytest.mark.parametrize(("expression", "why"), [
    ("9 ** 9 ** 9", "exponent"),
    ("pow(pow(10, 4000), 4000)", "bits"),
    ("a / 0", "ZeroDivisionError"),
    ("sqrt(-a)", "ValueError"),
    ("10.0 ** 400", "OverflowError"),
])
def test_runaway_or_undefined_arithmetic_fails_the_node_with_a_clear_message(expression, why):
    with pytest.raises(NodeFailed) as err:
        RUNNERS["math/expression"](None, {"expression": expression}, {"a": 1})  # type: ignore[arg-type]
    assert why in str(err.value)


def test_the_node_outputs_a_float_an_int_and_a_bool_as_comfyui_does():
    out: dict[str, Any] = RUNNERS["math/expression"](
        None, {"expression": "a / b"}, {"a": 7, "b": 2})  # type: ignore[arg-type]
    assert out == {"float": 3.5, "int": 3, "bool": True}
    out = RUNNERS["math/expression"](None, {"expression": "a - a"}, {"a": True})  # type: ignore[arg-type]
    assert out == {"float": 0.0, "int": 0, "bool": False}
