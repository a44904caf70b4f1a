"""ComfyUI's UI (workflow) format → its API (prompt) format, the way ComfyUI's frontend does it.

The UI format saves nodes with positional `widgets_values`, a `links` table, a `mode` per node
(0 always, 2 muted, 4 bypassed), UI-only nodes (Note, Reroute, PrimitiveNode) and subgraphs
(`definitions.subgraphs`, instanced by a node whose `type` is the subgraph's id). The result is
`{node_id: {"class_type", "inputs"}}` with links as `[node_id, slot]`: inner nodes of a subgraph
instance `57` get ids `57:<inner id>`, as ComfyUI's own API export names them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from apps.importer.comfy_nodes import (
    CONTROL,
    CONTROL_VALUES,
    DYNAMIC_WIDGETS,
    NOTE_TYPES,
    PRIMITIVE_NODE,
    REROUTE,
    WIDGETS,
)
from apps.importer.report import ImportInvalid, Report

MUTED, BYPASSED = 2, 4
# Subgraph input types the editor shows as widgets on the instance (the rest are sockets).
WIDGET_TYPES = frozenset({"STRING", "BOOLEAN", "INT", "FLOAT", "COMBO"})
SUBGRAPH_IN, SUBGRAPH_OUT = -10, -20  # ids of a subgraph's boundary nodes in its links
_IN_NODE, _OUT_NODE = "<subgraph inputs>", "<subgraph outputs>"  # our virtual pass-throughs


@dataclass(frozen=True)
class Bounds:
    """How large a flattened workflow may be: `nodes` (instances and the virtual boundaries
    they add included) and `depth` (subgraphs within subgraphs). Settings
    INLINE_IMPORT_MAX_NODES / INLINE_IMPORT_MAX_DEPTH."""

    nodes: int = 2000
    depth: int = 16


@dataclass
class Slot:
    """One input of a UI node: its upstream output, or the value a boundary gives it."""

    name: str
    type: str
    origin: tuple[str, int] | None = None
    widget: str | None = None
    value: Any = None


@dataclass
class UiNode:
    id: str
    type: str
    mode: int
    inputs: list[Slot]
    widgets: dict[str, Any]
    title: str = ""
    bypass_inputs: list[Slot] | None = None  # for a subgraph instance: its outer inputs
    virtual: bool = False
    properties: dict[str, Any] = field(default_factory=dict)
    raw_values: Any = None  # widgets_values as saved


@dataclass(frozen=True)
class Const:
    """A value that replaces a link (a PrimitiveNode's, or a subgraph input widget's)."""

    value: Any


@dataclass
class _Flat:
    bounds: Bounds
    nodes: dict[str, UiNode] = field(default_factory=dict)
    added: list[str] = field(default_factory=list)  # ids in the order they were added

    def add(self, node: UiNode) -> None:
        if node.id not in self.nodes:
            self.added.append(node.id)
            if len(self.added) > self.bounds.nodes:  # never reached past `_measure`; kept as
                raise _too_large_nodes(self.bounds, "the workflow")  # the expansion's own guard
        self.nodes[node.id] = node


def workflow_to_prompt(doc: dict[str, Any], report: Report,
                       bounds: Bounds | None = None) -> dict[str, dict[str, Any]]:
    """The API prompt of a UI workflow; UI-only, muted and bypassed nodes are reported dropped.
    ImportInvalid(too_large) naming the subgraph, before anything is expanded, when the
    flattened workflow would pass `bounds`."""
    bounds = bounds or Bounds()
    subgraphs = {str(s.get("id")): s for s in _subgraph_defs(doc)}
    _measure(doc, subgraphs, bounds)
    flat = _Flat(bounds)
    _flatten(doc, "", subgraphs, flat, depth=0, report=report)
    prompt: dict[str, dict[str, Any]] = {}
    for node in flat.nodes.values():
        if node.virtual:
            continue
        if _reported_away(node, report):
            continue
        prompt[node.id] = {"class_type": node.type, "inputs": _api_inputs(node, flat),
                           "_meta": {"title": node.title}}
    return prompt


# --- bounding the expansion before it happens ---------------------------------------------------


def _too_large_nodes(bounds: Bounds, what: str, node_id: str | None = None) -> ImportInvalid:
    return ImportInvalid("too_large", f"{what} expands to more than {bounds.nodes} nodes once "
                         "its subgraphs are flattened (INLINE_IMPORT_MAX_NODES)", node_id)


def _measure(doc: dict[str, Any], subgraphs: dict[str, dict[str, Any]], bounds: Bounds) -> None:
    """Refuse a workflow whose flattening would pass `bounds`, naming the subgraph, without
    expanding it: each definition is measured once (its flattened size and nesting depth are
    remembered), so the cost is linear in the workflow's own size, however many instances."""
    measured: dict[str, tuple[int, int]] = {}  # subgraph id → (nodes flattened, levels)
    total = 0
    for raw in _graph_nodes(doc):
        node_type = str(raw.get("type") or "")
        size = 1
        if node_type in subgraphs:
            name = _subgraph_name(subgraphs[node_type])
            try:
                inner, levels = _measure_subgraph(node_type, subgraphs, bounds, measured, ())
            except ImportInvalid as exc:  # a subgraph inside it: the instance here is the culprit
                exc.node_id = exc.node_id or str(raw.get("id"))
                raise
            if levels > bounds.depth:
                raise ImportInvalid("too_large", f"subgraph {name!r} nests subgraphs {levels} "
                                    f"deep; the limit is {bounds.depth} "
                                    "(INLINE_IMPORT_MAX_DEPTH)", str(raw.get("id")))
            size += inner
        total += size
        if total > bounds.nodes:
            what = (f"subgraph {_subgraph_name(subgraphs[node_type])!r} (node {raw.get('id')})"
                    if node_type in subgraphs else "the workflow")
            raise _too_large_nodes(bounds, what, str(raw.get("id")))


def _measure_subgraph(sub_id: str, subgraphs: dict[str, dict[str, Any]], bounds: Bounds,
                      measured: dict[str, tuple[int, int]], trail: tuple[str, ...]
                      ) -> tuple[int, int]:
    """(nodes the subgraph flattens to, with its boundary; levels of nesting, itself 1). The
    recursion is at most `bounds.depth` deep: a deeper trail (or a subgraph holding itself) is
    refused on the way down."""
    if sub_id in measured:
        return measured[sub_id]
    name = _subgraph_name(subgraphs[sub_id])
    if sub_id in trail or len(trail) >= bounds.depth:
        raise ImportInvalid("too_large", f"subgraph {name!r} nests subgraphs deeper than "
                            f"{bounds.depth} levels (INLINE_IMPORT_MAX_DEPTH)"
                            + (" (it holds itself)" if sub_id in trail else ""))
    size, levels = 1, 1  # its input boundary
    for raw in _graph_nodes(subgraphs[sub_id]):
        node_type = str(raw.get("type") or "")
        size += 1
        if node_type in subgraphs:
            inner, inner_levels = _measure_subgraph(node_type, subgraphs, bounds, measured,
                                                    (*trail, sub_id))
            size, levels = size + inner, max(levels, inner_levels + 1)
        if size > bounds.nodes:
            raise _too_large_nodes(bounds, f"subgraph {name!r}")
    measured[sub_id] = (size, levels)
    return size, levels


def _subgraph_name(definition: dict[str, Any]) -> str:
    return str(definition.get("name") or definition.get("id"))[:100]


def _graph_nodes(graph: dict[str, Any]) -> list[dict[str, Any]]:
    nodes = graph.get("nodes")
    return [n for n in nodes if isinstance(n, dict)] if isinstance(nodes, list) else []


# --- reading the workflow into one flat set of nodes --------------------------------------------


def _subgraph_defs(doc: dict[str, Any]) -> list[dict[str, Any]]:
    definitions = doc.get("definitions")
    subgraphs = definitions.get("subgraphs") if isinstance(definitions, dict) else None
    return [s for s in subgraphs or [] if isinstance(s, dict)]


def _links(raw: Any) -> dict[int, tuple[int, int, int, int, str]]:
    """link id → (origin id, origin slot, target id, target slot, type); both saved shapes."""
    table: dict[int, tuple[int, int, int, int, str]] = {}
    for link in raw or []:
        if isinstance(link, list) and len(link) >= 5:
            table[int(link[0])] = (int(link[1]), int(link[2]), int(link[3]), int(link[4]),
                                   str(link[5]) if len(link) > 5 else "*")
        elif isinstance(link, dict) and "id" in link:
            table[int(link["id"])] = (int(link["origin_id"]), int(link["origin_slot"]),
                                      int(link["target_id"]), int(link["target_slot"]),
                                      str(link.get("type", "*")))
    return table


def _flatten(
    graph: dict[str, Any], prefix: str, subgraphs: dict[str, dict[str, Any]], flat: _Flat,
    *, depth: int, report: Report, boundary: list[Slot] | None = None, mode: int = 0,
) -> list[tuple[str, int] | None]:
    """Add `graph`'s nodes (ids prefixed) to `flat`; returns the origins of its outputs when
    `graph` is a subgraph (`boundary`: the instance's inputs, one per subgraph input)."""
    if depth > flat.bounds.depth:  # `_measure` refused it already; the expansion's own guard
        raise ImportInvalid("too_large", f"subgraphs nest deeper than {flat.bounds.depth} "
                            "levels (INLINE_IMPORT_MAX_DEPTH)")
    links = _links(graph.get("links"))
    nodes = [n for n in graph.get("nodes") or [] if isinstance(n, dict)]
    ids = {int(n["id"]) for n in nodes if _is_int(n.get("id"))}
    if boundary is not None:
        flat.add(UiNode(f"{prefix}{SUBGRAPH_IN}", _IN_NODE, 0, boundary, {}, virtual=True))
        ids.add(SUBGRAPH_IN)
    for raw in nodes:
        node = _read_node(raw, prefix, links, ids, mode)
        definition = subgraphs.get(node.type)
        if definition is not None:
            _expand(node, definition, subgraphs, flat, depth=depth, report=report)
        else:
            flat.add(node)
    outputs: list[tuple[str, int] | None] = []
    for index, _ in enumerate(graph.get("outputs") or []):
        origin = next(((o, s) for o, s, t, ts, _ in links.values()
                       if t == SUBGRAPH_OUT and ts == index), None)
        outputs.append(None if origin is None else (f"{prefix}{origin[0]}", origin[1]))
    return outputs


def _read_node(raw: dict[str, Any], prefix: str, links: dict[int, Any], ids: set[int],
               inherited_mode: int) -> UiNode:
    if not _is_int(raw.get("id")):
        raise ImportInvalid("bad_workflow", f"a node has no integer id: {str(raw)[:80]}")
    node_id, node_type = f"{prefix}{raw['id']}", str(raw.get("type") or "")
    mode = int(raw.get("mode") or 0)
    if inherited_mode in (MUTED, BYPASSED):
        mode = inherited_mode
    slots = [_read_slot(s, node_id, prefix, links, ids) for s in raw.get("inputs") or []
             if isinstance(s, dict)]
    widgets = widgets_by_name(node_type, raw.get("widgets_values"))
    title = str(raw.get("title") or "")
    properties = raw.get("properties")
    if not isinstance(properties, dict):
        properties = {}
    return UiNode(node_id, node_type, mode, slots, widgets, title, properties=properties,
                  raw_values=raw.get("widgets_values"))


def _read_slot(raw: dict[str, Any], node_id: str, prefix: str, links: dict[int, Any],
               ids: set[int]) -> Slot:
    widget = raw.get("widget")
    slot = Slot(str(raw.get("name", "")), str(raw.get("type", "*")),
                widget=str(widget["name"]) if isinstance(widget, dict) and "name" in widget
                else None)
    link_id = raw.get("link")
    if link_id is None:
        return slot
    link = links.get(int(link_id)) if _is_int(link_id) else None
    if link is None:
        raise ImportInvalid("dangling_link", f"input {slot.name!r} of node {node_id} names link "
                            f"{link_id}, which the workflow's links table does not hold", node_id)
    if link[0] not in ids:
        raise ImportInvalid("dangling_link", f"input {slot.name!r} of node {node_id} is linked "
                            f"from node {prefix}{link[0]}, which does not exist", node_id)
    slot.origin = (f"{prefix}{link[0]}", link[1])
    return slot


def _expand(instance: UiNode, definition: dict[str, Any], subgraphs: dict[str, dict[str, Any]],
            flat: _Flat, *, depth: int, report: Report) -> None:
    """Flatten a subgraph instance: its inner nodes become `<instance id>:<inner id>`; the
    instance stays as a virtual pass-through from the inner outputs to its own outputs."""
    name = str(definition.get("name") or definition.get("id"))
    boundary = _boundary(instance, definition)
    prefix = f"{instance.id}:"
    start = len(flat.added)
    outputs = _flatten(definition, prefix, subgraphs, flat, depth=depth + 1, report=report,
                       boundary=boundary, mode=instance.mode)
    _apply_proxy_widgets(instance, prefix, flat)
    flat.add(UiNode(
        instance.id, _OUT_NODE, instance.mode,
        [Slot(str(o.get("name", "")), str(o.get("type", "*")), origin)
         for o, origin in zip(definition.get("outputs") or [], outputs, strict=False)],
        {}, instance.title, bypass_inputs=boundary, virtual=True))
    # The nodes this expansion added (not a scan of every node so far: that made flattening
    # quadratic in the workflow's size).
    inner = sorted(n for n in flat.added[start:] if n.startswith(prefix)
                   and not flat.nodes[n].virtual)
    report.drop(instance.id, instance.type, f"subgraph {name!r} flattened into its nodes "
                f"{', '.join(inner) or '(none)'}")


def _boundary(instance: UiNode, definition: dict[str, Any]) -> list[Slot]:
    """One slot per subgraph input: the instance's input of that name (matched by name, as the
    instance may list only some), or the value its promoted widget holds."""
    by_name = {s.name: s for s in instance.inputs}
    proxy = _proxy_values(instance)
    widget_slots = [s for s in instance.inputs if s.widget]
    raw_values = instance.raw_values
    declared = definition.get("inputs") or []
    # The editor saves one value per widget input of the definition, in its order (the instance
    # may list only some of them); older saves one per widget input the instance lists.
    widget_names = [str(r.get("name", "")) for r in declared if r.get("type") in WIDGET_TYPES]
    by_definition = (isinstance(raw_values, list) and not proxy
                     and len(raw_values) == len(widget_names) != len(widget_slots))
    slots = []
    for raw in declared:
        name = str(raw.get("name", ""))
        outer = by_name.get(name)
        slot = Slot(name, str(raw.get("type", "*")), outer.origin if outer else None)
        if ("-1", name) in proxy:
            slot.value = proxy[("-1", name)]
        elif by_definition and name in widget_names and (outer is None or outer.origin is None):
            slot.value = raw_values[widget_names.index(name)]
        elif by_definition:
            pass  # linked from outside: the link is the value
        elif outer is not None and outer.widget and isinstance(raw_values, list) and not proxy:
            index = widget_slots.index(outer)
            slot.value = raw_values[index] if index < len(raw_values) else None
        slots.append(slot)
    return slots


def _proxy_values(instance: UiNode) -> dict[tuple[str, str], Any]:
    """`properties.proxyWidgets` pairs (inner node id or "-1", widget) → the instance's value."""
    proxies = instance.properties.get("proxyWidgets")
    values = instance.raw_values
    if not isinstance(proxies, list) or not isinstance(values, list):
        return {}
    found = {}
    for index, pair in enumerate(proxies):
        if isinstance(pair, list) and len(pair) == 2 and index < len(values):
            found[(str(pair[0]), str(pair[1]))] = values[index]
    return found


def _apply_proxy_widgets(instance: UiNode, prefix: str, flat: _Flat) -> None:
    """A widget promoted from an inner node: a non-null instance value overrides the inner one."""
    for (inner_id, widget), value in _proxy_values(instance).items():
        inner = flat.nodes.get(f"{prefix}{inner_id}")
        if inner_id != "-1" and inner is not None and widget != CONTROL and value is not None:
            inner.widgets[widget] = value


# --- positional widgets -----------------------------------------------------------------------


def widgets_by_name(node_type: str, values: Any) -> dict[str, Any]:
    """`widgets_values` by widget name, in the type's real order. The `control_after_generate`
    value after a seed is skipped when present (older saves lack it)."""
    if isinstance(values, dict):
        return dict(values)
    if node_type in DYNAMIC_WIDGETS and isinstance(values, list):
        return DYNAMIC_WIDGETS[node_type](values)
    names = WIDGETS.get(node_type)
    if not isinstance(values, list) or names is None:
        return {}
    named: dict[str, Any] = {}
    index = 0
    for name in names:
        if index >= len(values):
            break
        if name == CONTROL:
            if values[index] in CONTROL_VALUES or values[index] is None:
                index += 1
            continue
        named[name] = values[index]
        index += 1
    return named


# --- resolving links through reroutes, primitives, bypassed nodes, subgraph boundaries --------


def _resolve(origin: tuple[str, int], want: str, flat: _Flat) -> tuple[str, int] | Const | None:
    """The real upstream output (or constant) an input receives; None when nothing reaches it
    (a muted node, a bypassed node without a matching input, an empty boundary)."""
    for _ in range(len(flat.nodes) + 1):
        node = flat.nodes.get(origin[0])
        if node is None:
            return None
        if node.mode == MUTED:
            return None
        if node.type == PRIMITIVE_NODE:
            raw = node.widgets.get("value")
            return Const(raw)
        if node.mode == BYPASSED:
            slot = _bypass_slot(node, origin[1], want)
        elif node.type in (REROUTE, _IN_NODE, _OUT_NODE):
            index = 0 if node.type == REROUTE else origin[1]
            slot = node.inputs[index] if index < len(node.inputs) else None
        else:
            return origin
        if slot is None:
            return None
        if slot.origin is None:
            return None if slot.value is None else Const(slot.value)
        origin = slot.origin
    raise ImportInvalid("cycle", f"links loop through node {origin[0]}", origin[0])


def _bypass_slot(node: UiNode, out_slot: int, want: str) -> Slot | None:
    """ComfyUI's bypass: the input at the output's index if its type matches, else the first
    input of the wanted type."""
    candidates = node.bypass_inputs if node.bypass_inputs is not None else node.inputs
    ordered = ([candidates[out_slot]] if out_slot < len(candidates) else []) + candidates
    return next((s for s in ordered if _same_type(s.type, want)), None)


def _same_type(a: str, b: str) -> bool:
    a, b = a.upper(), b.upper()
    return a == b or "*" in (a, b)


def _api_inputs(node: UiNode, flat: _Flat) -> dict[str, Any]:
    inputs = dict(node.widgets)
    for slot in node.inputs:
        name = slot.widget or slot.name
        if slot.origin is None:
            continue
        resolved = _resolve(slot.origin, slot.type, flat)
        if isinstance(resolved, Const):
            inputs[name] = resolved.value
        elif resolved is not None:
            inputs[name] = [resolved[0], resolved[1]]
    return inputs


def _reported_away(node: UiNode, report: Report) -> bool:
    """UI-only, muted and bypassed nodes never reach the prompt; each is reported dropped."""
    if node.type in NOTE_TYPES:
        report.drop(node.id, node.type, "a note: UI only")
    elif node.type == REROUTE:
        report.drop(node.id, node.type, "a reroute: UI only; its links were joined")
    elif node.type == PRIMITIVE_NODE:
        report.drop(node.id, node.type, f"a UI primitive: its value {node.widgets.get('value')!r} "
                    "was written into the widgets it feeds")
    elif node.mode == MUTED:
        report.drop(node.id, node.type, "muted (mode 2): ComfyUI does not run it")
    elif node.mode == BYPASSED:
        report.drop(node.id, node.type, "bypassed (mode 4): its consumers were rewired to its "
                    "matching input")
    else:
        return False
    return True


def _is_int(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, str) and value.lstrip("-").isdigit()
