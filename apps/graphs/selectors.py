"""Reads on the node registry as clients see it: descriptors with the fleet's model files."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from apps.fleet.selectors import LiveFleet
from apps.graphs.families import ModelFile, fleet_files
from apps.graphs.registry import descriptor_get, descriptors_all

Files = dict[tuple[str, str], ModelFile]


def descriptor_to_wire_with_models(descriptor: Any, files: Files,
                                   family: str | None = None) -> dict[str, Any]:
    """The descriptor with each model param's `choices`: the files of its folder that live
    workers hold, only the param's own family's (or `family`'s, when given)."""
    wire = descriptor.to_wire()
    for param in wire["params"]:
        if param["optionsFrom"]:
            wanted = param["family"] or family
            param["choices"] = [name for (folder, name), f in files.items()
                                if folder == param["optionsFrom"]
                                and (wanted is None or wanted in f.families)]
    return wire


def registry_for_clients(family: str | None = None) -> dict[str, Any]:
    """`{registryVersion, nodes}`; the version changes whenever a descriptor or model list does.
    With `family`, model pickers list only that family's files."""
    files = model_files_live()
    nodes = [descriptor_to_wire_with_models(d, files, family) for d in descriptors_all()]
    blob = json.dumps(nodes, sort_keys=True, separators=(",", ":")).encode()
    return {"registryVersion": hashlib.sha256(blob).hexdigest()[:16], "nodes": nodes}


def descriptor_for_clients(node_type: str, family: str | None = None) -> dict[str, Any] | None:
    descriptor = descriptor_get(node_type)
    if descriptor is None:
        return None
    return descriptor_to_wire_with_models(descriptor, model_files_live(), family)


def model_files_live(family: str | None = None) -> Files:
    """(folder, name) → every model file a live worker holds (of `family`, when given)."""
    files = fleet_files(LiveFleet().workers)
    return {k: f for k, f in files.items() if family is None or family in f.families}
