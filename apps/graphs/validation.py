"""Graph validation: everything that can be known about a graph without a database or a GPU.

`graph_validate` either returns the normalised graph (every param present, defaults filled in)
or raises `GraphInvalid` naming the node. Checks that need the database (assets, model files)
live in the runs service, which calls `asset_params` / `model_params` to find what to check.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Iterable, Iterator
from typing import Any

from apps.graphs.descriptors import NodeDescriptor, Param
from apps.graphs.mathexpr import NAMES as MATH_NAMES
from apps.graphs.mathexpr import expression_parse, expression_problem
from apps.graphs.registry import descriptor_get
from apps.graphs.schema import GraphDoc, InputRef, NodeSpec


class GraphInvalid(Exception):
    """A graph cannot run; `code` is stable for clients, `node_id` names the culprit."""

    def __init__(self, code: str, message: str, node_id: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.node_id = node_id


def graph_validate(doc: GraphDoc, *, target: str, max_nodes: int = 500) -> GraphDoc:
    """Check `doc` and its `target`; return the graph with defaults filled in."""
    if not doc.nodes:
        raise GraphInvalid("empty_graph", "the graph has no nodes")
    if len(doc.nodes) > max_nodes:
        raise GraphInvalid("too_many_nodes", f"the graph has {len(doc.nodes)} nodes (max {max_nodes})")
    normalised = {node_id: _node_validate(doc, node_id, spec) for node_id, spec in doc.nodes.items()}
    graph = GraphDoc(nodes=normalised)
    if target not in graph.nodes:
        raise GraphInvalid("unknown_target", f"target {target!r} is not a node of the graph", target)
    _reject_cycles(graph)
    for node_id in _runnable_closure(graph, target):
        descriptor = _descriptor(graph.nodes[node_id].type, node_id)
        if not descriptor.runnable:
            raise GraphInvalid(
                "not_runnable",
                f"node type {descriptor.type!r} has no runner on this farm yet",
                node_id,
            )
    return graph


def closure_order(
    doc: GraphDoc, target: str, chosen: dict[str, frozenset[str]] | None = None
) -> list[str]:
    """The target's upstream closure in topological order (inputs first, ties by node id).

    With `chosen` (the executor's lazy plan), a node's lazy inputs (a switch's branches) count
    only once chosen: `chosen[node]` names the lazy inputs it asked for, and a node not in it
    has asked for none yet. Without it, every input counts (the whole graph, as validated).
    Call only on a graph that passed `graph_validate` (acyclic, every reference resolves).
    Iterative, so a long chain of nodes cannot exhaust Python's recursion limit.
    """
    order: list[str] = []
    seen: set[str] = {target}
    stack: list[tuple[str, list[str]]] = [(target, _upstream(doc, target, chosen))]
    while stack:
        node_id, pending = stack[-1]
        if pending:
            upstream = pending.pop(0)
            if upstream not in seen:
                seen.add(upstream)
                stack.append((upstream, _upstream(doc, upstream, chosen)))
            continue
        stack.pop()
        order.append(node_id)
    return order


def preview_nodes(doc: GraphDoc) -> list[str]:
    """The nodes that show a value on their run (`util/preview`), by id: they run with any
    target, once every input they read was computed."""
    return sorted(node_id for node_id, spec in doc.nodes.items()
                  if (d := descriptor_get(spec.type)) is not None and d.shows_value)


def _runnable_closure(doc: GraphDoc, target: str) -> list[str]:
    order = closure_order(doc, target)
    for preview in preview_nodes(doc):
        order += closure_order(doc, preview)
    return list(dict.fromkeys(order))


def _upstream(
    doc: GraphDoc, node_id: str, chosen: dict[str, frozenset[str]] | None = None
) -> list[str]:
    spec = doc.nodes[node_id]
    refs: Iterable[InputRef] = spec.inputs.values()
    if chosen is not None:
        descriptor = descriptor_get(spec.type)
        if descriptor is not None and descriptor.lazy:
            asked = chosen.get(node_id, frozenset())
            refs = [ref for name, ref in spec.inputs.items()
                    if name not in descriptor.lazy or name in asked]
    return [ref.node for ref in sorted(refs, key=lambda r: (r.node, r.port))]


def param_refs(doc: GraphDoc, node_ids: list[str], param_type: str) -> Iterator[tuple[str, Param, Any]]:
    """(node id, param, value) for every param of `param_type` set in the given nodes."""
    for node_id in node_ids:
        spec = doc.nodes[node_id]
        descriptor = _descriptor(spec.type, node_id)
        for param in descriptor.params:
            value = spec.params.get(param.name)
            if param.type == param_type and value not in (None, ""):
                yield node_id, param, value


def _descriptor(node_type: str, node_id: str) -> NodeDescriptor:
    descriptor = descriptor_get(node_type)
    if descriptor is None:
        raise GraphInvalid("unknown_node_type", f"unknown node type {node_type!r}", node_id)
    return descriptor


def _node_validate(doc: GraphDoc, node_id: str, spec: NodeSpec) -> NodeSpec:
    descriptor = _descriptor(spec.type, node_id)
    _inputs_validate(doc, node_id, descriptor, spec.inputs)
    params = _params_validate(node_id, descriptor, spec)
    check = NODE_CHECKS.get(descriptor.type)
    if check is not None:
        check(node_id, params, spec)
    return NodeSpec(type=spec.type, params=params, inputs=spec.inputs)


def _math_check(node_id: str, params: dict[str, Any], spec: NodeSpec) -> None:
    """The expression parses, uses only what is allowed, and reads only wired inputs."""
    problem = expression_problem(params["expression"])
    if problem is not None:
        raise GraphInvalid("bad_expression", f"expression: {problem}", node_id)
    used = {n.id for n in ast.walk(expression_parse(params["expression"]))
            if isinstance(n, ast.Name) and n.id in MATH_NAMES}
    missing = sorted(used - spec.inputs.keys())
    if missing:
        raise GraphInvalid("bad_expression", f"expression reads {', '.join(missing)}, which "
                           "is not connected", node_id)


def _qwen21_images_check(node_id: str, params: dict[str, Any], spec: NodeSpec) -> None:
    """Qwen-Image 2.1's condition images are reference latents too: they need the VAE."""
    from apps.graphs.nodes_qwen import QWEN21_IMAGE_PORTS

    images = [port for port in QWEN21_IMAGE_PORTS if port in spec.inputs]
    if images and "vae" not in spec.inputs:
        raise GraphInvalid("missing_input", f"input 'vae' is required with condition images "
                           f"({', '.join(images)}): Qwen-Image 2.1 reads each as a VAE-encoded "
                           "reference latent", node_id)


NODE_CHECKS = {"math/expression": _math_check, "qwenimage21/encode": _qwen21_images_check}


def param_value_check(node_id: str, param: Param, value: Any) -> Any:
    """A value that reached a wired param at run time, checked as a submitted one would be
    (type, range, length, choice); GraphInvalid naming the node when it does not fit."""
    if param.type == "int" and isinstance(value, float) and not value.is_integer():
        value = int(value)  # ComfyUI's INT output of a float is truncated too
    return _param_check(node_id, param, value)


def _inputs_validate(
    doc: GraphDoc, node_id: str, descriptor: NodeDescriptor, inputs: dict[str, InputRef]
) -> None:
    for name, ref in inputs.items():
        port = descriptor.input(name)
        if port is None:
            known = ", ".join(p.name for p in descriptor.inputs) or "none"
            raise GraphInvalid(
                "unknown_input", f"{descriptor.type} has no input {name!r} (inputs: {known})", node_id
            )
        upstream = doc.nodes.get(ref.node)
        if upstream is None:
            raise GraphInvalid(
                "unknown_node", f"input {name!r} refers to missing node {ref.node!r}", node_id
            )
        source = _descriptor(upstream.type, ref.node).output(ref.port)
        if source is None:
            raise GraphInvalid(
                "unknown_output",
                f"input {name!r} refers to {ref.node}.{ref.port}, but {upstream.type} has no "
                f"output {ref.port!r}",
                node_id,
            )
        if source.passes is not None and source.passes not in upstream.inputs:
            raise GraphInvalid(
                "missing_input",
                f"{upstream.type}'s output {ref.port!r} passes on its input {source.passes!r}, "
                f"which is not connected (node {node_id!r} reads it)",
                ref.node,
            )
        if not port.takes(source.kind):
            raise GraphInvalid(
                "kind_mismatch",
                f"input {name!r} takes {port.kind}, but {ref.node}.{ref.port} gives {source.kind}",
                node_id,
            )
    for port in descriptor.inputs:
        if port.required and port.name not in inputs:
            raise GraphInvalid(
                "missing_input", f"required input {port.name!r} is not connected", node_id
            )


def _params_validate(node_id: str, descriptor: NodeDescriptor, spec: NodeSpec) -> dict[str, Any]:
    for name in spec.params:
        if descriptor.param(name) is None:
            known = ", ".join(p.name for p in descriptor.params) or "none"
            raise GraphInvalid(
                "unknown_param", f"{descriptor.type} has no param {name!r} (params: {known})", node_id
            )
    values: dict[str, Any] = {}
    for param in descriptor.params:
        wired = param.input is not None and param.input in spec.inputs
        if param.name in spec.params and spec.params[param.name] is not None:
            values[param.name] = _param_check(node_id, param, spec.params[param.name])
        elif param.required and not wired:
            raise GraphInvalid("missing_param", f"param {param.name!r} is required", node_id)
        else:
            values[param.name] = param.default
    return values


def _param_check(node_id: str, param: Param, value: Any) -> Any:
    checked = _param_type_check(node_id, param, value)
    if param.type in ("int", "float"):
        _param_range_check(node_id, param, checked)
    limit = param.length_limit
    if limit is not None and len(checked) > limit:
        raise GraphInvalid(
            "param_too_long",
            f"param {param.name!r} is {len(checked)} characters; the limit is {limit}",
            node_id,
        )
    if param.type == "enum" and param.choices and checked not in param.choices:
        raise GraphInvalid(
            "param_choice",
            f"param {param.name!r} is {checked!r}; choose one of {', '.join(param.choices)}",
            node_id,
        )
    return checked


_PYTHON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "enum": (str,),
    "asset": (str,),
    "model": (str,),
    "bool": (bool,),
    "int": (int,),
    "float": (int, float),
}


def _param_type_check(node_id: str, param: Param, value: Any) -> Any:
    ok = isinstance(value, _PYTHON_TYPES[param.type])
    if param.type in ("int", "float") and isinstance(value, bool):
        ok = False  # JSON true is not a number
    if param.type == "int" and isinstance(value, float) and value.is_integer():
        ok, value = True, int(value)
    if not ok:
        raise GraphInvalid(
            "param_type",
            f"param {param.name!r} must be {param.type}, got {type(value).__name__} "
            f"{_preview(value)}",
            node_id,
        )
    return _finite(node_id, param, value) if param.type == "float" else value


def _finite(node_id: str, param: Param, value: float) -> float:
    """NaN compares false with every bound and ±Infinity is no JSON number: refuse both."""
    try:
        number = float(value)
    except OverflowError:  # an integer too large for a float
        number = math.inf
    if not math.isfinite(number):
        raise GraphInvalid(
            "param_type", f"param {param.name!r} must be a finite number, got {_preview(value)}",
            node_id,
        )
    return number


def _preview(value: Any, limit: int = 80) -> str:
    """`repr(value)`, cut: an error message never echoes a client's megabyte back."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}…"


def _param_range_check(node_id: str, param: Param, value: float) -> None:
    if (param.min is not None and value < param.min) or (
        param.max is not None and value > param.max
    ):
        raise GraphInvalid(
            "param_range",
            f"param {param.name!r} is {value}; allowed range is {_fmt(param.min)}..{_fmt(param.max)}",
            node_id,
        )
    if param.multiple_of and int(value) % param.multiple_of:
        raise GraphInvalid(
            "param_range",
            f"param {param.name!r} is {value}; it must be a multiple of {param.multiple_of}",
            node_id,
        )


def _fmt(bound: float | None) -> str:
    if bound is None:
        return ""
    return str(int(bound)) if float(bound).is_integer() else str(bound)


def _reject_cycles(doc: GraphDoc) -> None:
    """Depth-first search with an explicit stack; a back edge names a node on the cycle."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in sorted(doc.nodes):
        if root in state:
            continue
        state[root] = 1
        stack: list[tuple[str, list[str]]] = [(root, _upstream(doc, root))]
        while stack:
            node_id, pending = stack[-1]
            if not pending:
                state[node_id] = 2
                stack.pop()
                continue
            upstream = pending.pop(0)
            if state.get(upstream) == 1:
                raise GraphInvalid(
                    "cycle", f"node {node_id!r} is part of a cycle (through {upstream!r})", node_id
                )
            if upstream not in state:
                state[upstream] = 1
                stack.append((upstream, _upstream(doc, upstream)))
