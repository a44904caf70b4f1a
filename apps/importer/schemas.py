"""Response schemas of /v1/import (the shapes apps/importer builds)."""

from __future__ import annotations

from typing import Any

from inline_farm.schemas import ErrorBody, WireOut


class ReportOut(WireOut):
    """Every ComfyUI node in exactly one of mapped, dropped or unmapped (apps/importer/report.py)."""

    format: str
    mapped: list[dict[str, Any]]
    dropped: list[dict[str, Any]]
    unmapped: list[dict[str, Any]]
    warnings: list[dict[str, Any]]
    models: list[dict[str, Any]]
    assets: list[dict[str, Any]]


class ImportOut(WireOut):
    """The typed graph (ready for `POST /v1/runs`), its target and the report."""

    graph: dict[str, Any]
    target: str
    report: ReportOut


class ImportErrorOut(WireOut):
    """The error shape plus the report of what the importer did before it gave up."""

    error: ErrorBody
    report: ReportOut | None
