"""The editor's templates browser on the farm: the workflows in apps/importer/comfy_template_files/
whose every node the farm knows (a template naming a node the farm lacks is left out), in the
index format the editor reads (`/templates/index.json`, then `/templates/<name>.json` and its
thumbnail `<name>-1.webp`).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from apps.importer.comfy_nodes import UI_ONLY
from apps.importer.comfy_object_info import object_info

FOLDER = Path(__file__).resolve().parent / "comfy_template_files"
# What each template says of itself in the browser: title, description (by file stem).
ABOUT: dict[str, dict[str, str]] = {
    "farm_zimage_turbo": {
        "title": "Z-Image Turbo",
        "description": "Text to image with Z-Image Turbo: 8 steps, no CFG."},
}
MEDIA = {".json": "application/json", ".webp": "image/webp", ".png": "image/png"}


def _node_types(workflow: dict[str, Any]) -> set[str]:
    """Every node type of a UI-format workflow, its subgraphs' nodes included (a subgraph's
    own instance type, its id, is not a node type)."""
    subgraphs = (workflow.get("definitions") or {}).get("subgraphs") or []
    inner = {s.get("id") for s in subgraphs}
    nodes = [*workflow.get("nodes", []), *(n for s in subgraphs for n in s.get("nodes", []))]
    return {str(n.get("type")) for n in nodes} - inner


@cache
def template_index() -> list[dict[str, Any]]:
    """The index, computed once per process: the templates are files of the installed farm."""
    runnable = set(object_info(catalog={}, uploads=[])) | set(UI_ONLY)
    templates = []
    for path in sorted(FOLDER.glob("*.json")):
        workflow = json.loads(path.read_text())
        if not _node_types(workflow) <= runnable:
            continue
        about = ABOUT.get(path.stem, {})
        templates.append({
            "name": path.stem, "title": about.get("title", path.stem),
            "description": about.get("description", ""), "mediaType": "image",
            "mediaSubtype": "webp", "tags": ["Image", "Inline Farm"]})
    return [{"moduleName": "default", "title": "Inline Farm", "type": "image",
             "category": "GENERATION TYPE", "icon": "icon-[lucide--image]",
             "templates": templates}]


def template_file(name: str) -> tuple[bytes, str] | None:
    """A listed template's workflow or thumbnail: (bytes, media type), or None."""
    listed = {t["name"] for group in template_index() for t in group["templates"]}
    stem, _, suffix = name.rpartition(".")
    base = stem.removesuffix("-1") if suffix != "json" else stem
    path = FOLDER / name
    if base not in listed or f".{suffix}" not in MEDIA or not path.is_file():
        return None
    return path.read_bytes(), MEDIA[f".{suffix}"]
