"""`manage.py farm_import FILE [--run] [--user USERNAME]`: import a ComfyUI workflow; print
`{graph, target, report}` as JSON, and with --run submit it as USERNAME's run."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.accounts.services import user_get_or_create
from apps.fleet.selectors import model_catalog_families
from apps.graphs.validation import GraphInvalid
from apps.importer.report import ImportInvalid
from apps.importer.services import comfy_import, workflow_parse
from apps.runs.services import RunConflict, RunLimitReached, run_submit


class Command(BaseCommand):
    help = "Import a ComfyUI workflow (UI or API format); --run also submits it."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", help="the workflow JSON (UI or API format)")
        parser.add_argument("--run", action="store_true", help="submit the imported graph")
        parser.add_argument("--user", default=os.environ.get("USER") or "farm",
                            help="who owns the run (created if needed; default: $USER)")

    def handle(self, *args: Any, **options: Any) -> None:
        path = Path(options["file"])
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise CommandError(f"cannot read {path}: {exc}") from None
        try:
            catalog, files = model_catalog_families()
            imported = comfy_import(workflow=workflow_parse(raw), catalog=catalog, files=files)
        except ImportInvalid as exc:
            report = exc.report.to_wire() if exc.report is not None else None
            self.stdout.write(json.dumps({"error": _error(exc), "report": report}, indent=2))
            raise CommandError(f"{exc.code}: {exc.message}") from None
        body = imported.to_wire()
        if options["run"]:
            body["runId"] = self._submit(options["user"], imported)
        self.stdout.write(json.dumps(body, indent=2))

    def _submit(self, username: str, imported: Any) -> str:
        owner = user_get_or_create(username=username)
        try:
            run, created = run_submit(owner=owner, graph=imported.graph, target=imported.target)
        except GraphInvalid as exc:
            raise CommandError(f"the farm refused the graph: {exc.code}: {exc.message}"
                               f"{f' (node {exc.node_id})' if exc.node_id else ''}") from None
        except (RunConflict, RunLimitReached) as exc:
            raise CommandError(str(exc)) from None
        verb = "submitted" if created else "already in flight as"
        self.stderr.write(f"{verb} run {run.pk} for {username} (target {imported.target})")
        return str(run.pk)


def _error(exc: ImportInvalid) -> dict[str, Any]:
    error: dict[str, Any] = {"code": exc.code, "message": exc.message}
    if exc.node_id is not None:
        error["nodeId"] = exc.node_id
    return error
