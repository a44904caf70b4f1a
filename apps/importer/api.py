"""/v1/import: ComfyUI workflow → typed graph (the importer is a later issue)."""

from __future__ import annotations

from ninja import Router

router = Router(tags=["import"])
