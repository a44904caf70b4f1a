"""`manage.py farm_templates [--all] [--json]`: which of ComfyUI's shipped workflows import on
this farm, weighted by ComfyUI's own use counts: the share of use that imports, then each
workflow that does not (most used first) with the importer's reason — the farm's to-do list."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from apps.importer.comfy_templates import shipped_coverage


class Command(BaseCommand):
    help = "How much of ComfyUI's shipped workflows (weighted by use) imports on this farm."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--all", action="store_true", help="every workflow, not the top 25")
        parser.add_argument("--json", action="store_true", help="the whole table as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        found = shipped_coverage()
        if options["json"]:
            self.stdout.write(json.dumps(found, indent=1))
            return
        self.stdout.write(
            f"{found['importing']} of {found['templates']} shipped workflows import here: "
            f"{found['share']:.1%} of their use ({found['usage_importing']} of {found['usage']})")
        rows = sorted(found["rows"], key=lambda r: -r["usage"])
        shown = rows if options["all"] else [r for r in rows if r["why_not"]][:25]
        for row in shown:
            verdict = "imports" if row["why_not"] is None else row["why_not"][:150]
            self.stdout.write(f"{row['usage']:>7}  {row['name']}: {verdict}")
