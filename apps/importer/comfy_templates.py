"""The editor's templates browser on the farm: the farm's own workflows
(apps/importer/comfy_template_files/, each kept when every node runs here), then ComfyUI's own
shipped workflows (the `comfyui-workflow-templates-json` package: its index with titles, tags
and use counts, and the workflow files) kept when the importer imports them here, in ComfyUI's
own groups and order. The index format is what the editor reads (`/templates/index.json`, or
`index.<locale>.json`, then `/templates/<name>.json` and its thumbnail `<name>-1.webp`). The
shipped thumbnails live in ComfyUI's media packages (~100 MB each, not installed): each listed
shipped workflow gets a plain card with its title instead.

`shipped_coverage()` is the same judgement over every shipped workflow, weighted by use: how
much of what studios run in ComfyUI imports here (`./farm manage farm_templates`).
"""

from __future__ import annotations

import io
import json
import textwrap
from functools import cache
from pathlib import Path
from typing import Any

import comfyui_workflow_templates_json

from apps.importer.comfy_nodes import UI_ONLY
from apps.importer.comfy_object_info import object_info
from apps.importer.report import ImportInvalid

FOLDER = Path(__file__).resolve().parent / "comfy_template_files"
SHIPPED = Path(comfyui_workflow_templates_json.__file__).resolve().parent / "templates"
# What each template says of itself in the browser: title, description (by file stem).
ABOUT: dict[str, dict[str, str]] = {
    "farm_zimage_turbo": {
        "title": "Z-Image Turbo",
        "description": "Text to image with Z-Image Turbo: 8 steps, no CFG."},
}
# A shipped workflow whose nodes say no family (a bare CheckpointLoaderSimple) is listed when
# its checkpoint's name says one the farm runs: ComfyUI's SDXL templates (a listing hint only;
# what runs is decided by the held file's contents, as for any workflow).
NAME_HINTS: dict[str, tuple[str, ...]] = {"sdxl": ("sdxl", "sd_xl")}
MEDIA = {".json": "application/json", ".webp": "image/webp", ".png": "image/png"}


def _node_types(workflow: dict[str, Any]) -> set[str]:
    """Every node type of a UI-format workflow, its subgraphs' nodes included (a subgraph's
    own instance type, its id, is not a node type)."""
    subgraphs = (workflow.get("definitions") or {}).get("subgraphs") or []
    inner = {s.get("id") for s in subgraphs}
    nodes = [*workflow.get("nodes", []), *(n for s in subgraphs for n in s.get("nodes", []))]
    return {str(n.get("type")) for n in nodes} - inner


@cache
def template_index(locale: str = "") -> list[dict[str, Any]] | None:
    """The index, computed once per process and locale (the templates are files of the
    installed farm); None for a locale ComfyUI ships no index in."""
    shipped = _shipped_index(locale)
    if shipped is None:
        return None
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
    groups = [{"moduleName": "default", "title": "Inline Farm", "type": "image",
               "category": "GENERATION TYPE", "icon": "icon-[lucide--image]",
               "templates": templates}]
    imports = shipped_imports()
    for group in shipped:
        kept = [{**_without_media(t), "mediaType": "image", "mediaSubtype": "webp"}
                for t in group.get("templates", []) if imports.get(t.get("name")) is None]
        if kept:
            groups.append({**group, "templates": kept})
    return groups


def template_file(name: str) -> tuple[bytes, str] | None:
    """A listed template's workflow or thumbnail: (bytes, media type), or None."""
    stem, _, suffix = name.rpartition(".")
    base = stem if suffix == "json" else stem.rsplit("-", 1)[0]
    if f".{suffix}" not in MEDIA or "/" in name or "\\" in name:
        return None
    own = {t["name"] for t in (template_index() or [{}])[0].get("templates", [])}
    if base in own:
        path = FOLDER / name
        return (path.read_bytes(), MEDIA[f".{suffix}"]) if path.is_file() else None
    if shipped_imports().get(base, "not shipped") is not None:
        return None
    if suffix == "json":
        found = shipped_file(name)
        return (found, MEDIA[".json"]) if found is not None else None
    return _card(base), "image/webp"


def shipped_file(name: str) -> bytes | None:
    """One of ComfyUI's shipped workflow files, by file name."""
    path = SHIPPED / name
    if "/" in name or "\\" in name or not name.endswith(".json") or not path.is_file():
        return None
    return path.read_bytes()


def _shipped_index(locale: str) -> list[dict[str, Any]] | None:
    path = SHIPPED / (f"index.{locale}.json" if locale else "index.json")
    if (locale and not locale.replace("-", "").isalnum()) or not path.is_file():
        return None
    index = json.loads(path.read_text())
    return index if isinstance(index, list) else None


@cache
def shipped_imports() -> dict[str, str | None]:
    """Each shipped workflow in ComfyUI's index → None when it imports here, else why not
    (the importer's own words: the node it lacks, the family it does not run)."""
    from apps.importer.services import comfy_import

    found: dict[str, str | None] = {}
    for group in _shipped_index("") or []:
        for entry in group.get("templates", []):
            name = str(entry.get("name", ""))
            raw = shipped_file(f"{name}.json")
            if raw is None:
                found[name] = "no workflow file in the package"
                continue
            try:
                imported = comfy_import(workflow=json.loads(raw), catalog={})
            except ImportInvalid as exc:
                found[name] = f"{exc.code}: {exc.message}"
                continue
            samples = any(n.type.startswith(("sample", "ltx2/sample", "minimaxh3/sample"))
                          for n in imported.graph.nodes.values())
            named = {f for m in imported.report.models for f, hints in NAME_HINTS.items()
                     if any(h in str(m.get("requested") or m.get("name", "")).lower()
                            for h in hints)}
            found[name] = None if imported.report.families or named or not samples else (
                "its models name no family this farm runs (no loader type or family node says "
                "which; a held file's contents would)")
    return found


def shipped_coverage() -> dict[str, Any]:
    """How much of ComfyUI's shipped workflows' use imports here: the templates' `usage`
    counts (ComfyUI's index), summed over those that import, over all of them."""
    imports = shipped_imports()
    rows = []
    for group in _shipped_index("") or []:
        for entry in group.get("templates", []):
            name = str(entry.get("name", ""))
            rows.append({"name": name, "group": group.get("title", ""),
                         "usage": int(entry.get("usage") or 0), "why_not": imports.get(name)})
    total = sum(r["usage"] for r in rows)
    runs = sum(r["usage"] for r in rows if r["why_not"] is None)
    return {"templates": len(rows), "importing": sum(r["why_not"] is None for r in rows),
            "usage": total, "usage_importing": runs,
            "share": round(runs / total, 4) if total else 0.0, "rows": rows}


def _without_media(entry: dict[str, Any]) -> dict[str, Any]:
    """A shipped entry without what points at ComfyUI's media packages (the farm shows cards)."""
    return {k: v for k, v in entry.items() if k not in ("thumbnailVariant", "thumbnail",
                                                       "io", "mediaSubtype", "mediaType")}


@cache
def _card(name: str) -> bytes:
    """A plain thumbnail for a shipped workflow: its title on the editor's dark grey."""
    from PIL import Image, ImageDraw

    titles = {t["name"]: t.get("title", t["name"]) for g in _shipped_index("") or []
              for t in g.get("templates", [])}
    image = Image.new("RGB", (320, 320), (38, 38, 42))
    draw = ImageDraw.Draw(image)
    lines = textwrap.wrap(str(titles.get(name, name)), width=26)[:6]
    top = 150 - 11 * len(lines)  # the editor's cards show the middle of a square thumbnail
    draw.multiline_text((40, top), "\n".join(lines), fill=(225, 225, 230), spacing=6)
    draw.text((40, top + 24 * len(lines) + 8), "ComfyUI template, runs here", fill=(140, 140, 150))
    out = io.BytesIO()
    image.save(out, format="WEBP", quality=80)
    return out.getvalue()
