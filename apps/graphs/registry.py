"""The registry: node type name → descriptor, and the registry's version for clients' caches."""

from __future__ import annotations

from apps.graphs.descriptors import NodeDescriptor
from apps.graphs.nodes import ALL_NODES

REGISTRY: dict[str, NodeDescriptor] = {}
for _descriptor in ALL_NODES:
    if _descriptor.type in REGISTRY:
        raise RuntimeError(f"node type {_descriptor.type!r} declared twice")
    REGISTRY[_descriptor.type] = _descriptor


def descriptor_get(node_type: str) -> NodeDescriptor | None:
    return REGISTRY.get(node_type)


def descriptors_all() -> list[NodeDescriptor]:
    return sorted(REGISTRY.values(), key=lambda d: d.type)
