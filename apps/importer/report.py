"""The import report: every ComfyUI node lands in exactly one of mapped, dropped or unmapped."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class ImportInvalid(Exception):
    """The workflow cannot become a usable graph; `code` is stable, `node_id` names the culprit
    (a ComfyUI node id, which is also the id of its node in our graph)."""

    def __init__(self, code: str, message: str, node_id: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.node_id = code, message, node_id
        self.report: Report | None = None


@dataclass
class Report:
    """What the importer did with each ComfyUI node, and what the caller must still provide.

    - mapped: `{id, type, as}` — became our node `id` of type `as`.
    - dropped: `{id, type, reason}` — removed on purpose; the graph means the same without it.
    - unmapped: `{id, type, reason}` — no equivalent here; what depends on it cannot run.
    - warnings: `{id, type, message}` — mapped, but something is ignored or approximated.
    - models: `{id, type, param, folder, name, held, requested}` — each model file and whether
      a live worker holds it (`requested` is the workflow's name when it resolved to another).
    - assets: `{id, type, file}` — images the workflow loads: upload them and set `asset`.
    """

    mapped: list[dict[str, Any]] = field(default_factory=list)
    dropped: list[dict[str, Any]] = field(default_factory=list)
    unmapped: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[dict[str, Any]] = field(default_factory=list)
    models: list[dict[str, Any]] = field(default_factory=list)
    assets: list[dict[str, Any]] = field(default_factory=list)
    format: str = ""
    # The registered families the workflow's own evidence names (loader types, family nodes,
    # held files' contents): none for one whose models say nothing (a bare checkpoint name).
    # Not on the wire: the templates browser reads it.
    families: list[str] = field(default_factory=list)

    def drop(self, node_id: str, node_type: str, reason: str) -> None:
        self.dropped.append({"id": node_id, "type": node_type, "reason": reason})

    def unmap(self, node_id: str, node_type: str, reason: str) -> None:
        self.unmapped.append({"id": node_id, "type": node_type, "reason": reason})

    def warn(self, node_id: str, node_type: str, message: str) -> None:
        self.warnings.append({"id": node_id, "type": node_type, "message": message})

    def to_wire(self) -> dict[str, Any]:
        key = _id_key
        return {
            "format": self.format,
            "mapped": sorted(self.mapped, key=key),
            "dropped": sorted(self.dropped, key=key),
            "unmapped": sorted(self.unmapped, key=key),
            "warnings": sorted(self.warnings, key=key),
            "models": sorted(self.models, key=key),
            "assets": sorted(self.assets, key=key),
        }


def id_order(node_id: str) -> tuple[Any, ...]:
    """Sort key for ComfyUI ids ("9" < "10" < "57:3"): numeric parts as numbers."""
    return tuple((0, int(p), "") if p.lstrip("-").isdigit() else (1, 0, p)
                 for p in str(node_id).split(":"))


def _id_key(entry: dict[str, Any]) -> tuple[Any, ...]:
    return id_order(entry["id"])
