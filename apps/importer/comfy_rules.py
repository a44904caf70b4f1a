"""The shape of the importer's mapping rules (comfy_nodes.py, comfy_vocab.py). TORCH-FREE."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Link:
    """An input wired to output `slot` of ComfyUI node `node` (the API format's [id, slot])."""

    node: str
    slot: int

CONTROL = "control_after_generate"  # the widget the editor adds after a seed (WIDGETS marks it)
CONTROL_VALUES = frozenset({"fixed", "increment", "decrement", "randomize"})
RESAMPLE = {"nearest-exact": "nearest", "bilinear": "bilinear", "area": "bilinear",
            "bicubic": "bicubic", "lanczos": "lanczos"}

Warn = Callable[[dict[str, Any]], list[str]]
# The kind (our port kind) of what feeds a ComfyUI input of the node being mapped, or None.
KindOf = Callable[[str], str | None]


@dataclass(frozen=True)
class ParamMap:
    """A ComfyUI widget → one of our params. `folder`: a model param resolved in that folder."""

    name: str
    convert: Callable[[Any], Any] = lambda v: v
    folder: str | None = None


@dataclass(frozen=True)
class Rule:
    """How one ComfyUI type becomes one of our node types."""

    type: str
    inputs: dict[str, str] = field(default_factory=dict)
    outputs: tuple[str | None, ...] = ()
    params: dict[str, ParamMap] = field(default_factory=dict)
    warnings: tuple[Warn, ...] = ()
    derive: Callable[[dict[str, Any]], dict[str, Any]] | None = None  # params from several widgets
    refuse: Callable[[dict[str, Any]], str | None] | None = None  # a reason it cannot map here
    # The rule that really applies, from the widgets and the kinds that feed the inputs (a
    # switch's type follows its branches, a resize its mode); a string is why none does.
    pick: Callable[[dict[str, Any], KindOf], Rule | str] | None = None


def resample(method: Any) -> Any:
    """A ComfyUI upscale method → ours (Pillow's filters; `area` is bilinear)."""
    return RESAMPLE.get(str(method), method)


def area_warning(values: dict[str, Any]) -> list[str]:
    if values.get("upscale_method") == "area":
        return ["upscale_method 'area' is approximated by 'bilinear'"]
    return []


Nodes = dict[str, tuple[str, dict[str, Any]]]  # id → (class_type, inputs with Links)


def linked(nodes: Nodes, link: Any) -> tuple[str, str, dict[str, Any]] | None:
    """(id, class_type, inputs) of the node `link` reads, None when it is no link."""
    if not isinstance(link, Link):
        return None
    comfy_type, inputs = nodes[link.node]
    return link.node, comfy_type, inputs


def readers_of(nodes: Nodes) -> dict[str, list[str]]:
    """Each node's readers: id → the ids of the nodes with an input linked from it."""
    readers: dict[str, list[str]] = {}
    for nid, (_, inputs) in nodes.items():
        for value in inputs.values():
            if isinstance(value, Link):
                readers.setdefault(value.node, []).append(nid)
    return readers
