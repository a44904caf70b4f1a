"""Reads on the node registry as clients see it: descriptors with the fleet's model files."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from apps.fleet.selectors import model_catalog
from apps.graphs.registry import descriptor_get, descriptors_all


def descriptor_to_wire_with_models(descriptor: Any, catalog: dict[str, list[str]]) -> dict[str, Any]:
    wire = descriptor.to_wire()
    for param in wire["params"]:
        if param["optionsFrom"]:
            param["choices"] = catalog.get(param["optionsFrom"], [])
    return wire


def registry_for_clients() -> dict[str, Any]:
    """`{registryVersion, nodes}`; the version changes whenever a descriptor or model list does."""
    catalog = model_catalog()
    nodes = [descriptor_to_wire_with_models(d, catalog) for d in descriptors_all()]
    blob = json.dumps(nodes, sort_keys=True, separators=(",", ":")).encode()
    return {"registryVersion": hashlib.sha256(blob).hexdigest()[:16], "nodes": nodes}


def descriptor_for_clients(node_type: str) -> dict[str, Any] | None:
    descriptor = descriptor_get(node_type)
    if descriptor is None:
        return None
    return descriptor_to_wire_with_models(descriptor, model_catalog())
