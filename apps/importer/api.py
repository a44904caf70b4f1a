"""/v1/import: a ComfyUI workflow (UI or API format) → our typed graph and a report."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse
from ninja import Router

from apps.fleet.selectors import model_catalog_families
from apps.importer.report import ImportInvalid
from apps.importer.schemas import ImportErrorOut, ImportOut
from apps.importer.services import comfy_import, workflow_parse
from inline_farm.endpoints import ApiError, errors, respond

router = Router(tags=["import"])

_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "description": "A ComfyUI workflow: the UI format (as saved by the "
    "editor) or the API format (as exported for the API, or the body of ComfyUI's /prompt)."}}}}}


@router.post("/comfy", summary="Import a ComfyUI workflow",
             response={200: ImportOut, 422: ImportErrorOut, **errors(401, 413)},
             openapi_extra=_BODY)
def import_comfy(request: HttpRequest) -> Any:
    """`{graph, target, report}`; 422 `{error: {code, message, nodeId?}, report}` when the
    workflow cannot become a graph that runs."""
    try:
        body = request.body
    except RequestDataTooBig:
        raise ApiError(413, "too_large", "the workflow is larger than the upload limit") from None
    try:
        catalog, files = model_catalog_families()
        imported = comfy_import(workflow=workflow_parse(body), catalog=catalog, files=files)
    except ImportInvalid as exc:
        return _invalid(request, exc)
    return imported.to_wire()


def _invalid(request: HttpRequest, exc: ImportInvalid) -> HttpResponse:
    error: dict[str, Any] = {"code": exc.code, "message": exc.message}
    if exc.node_id is not None:
        error["nodeId"] = exc.node_id
    report = exc.report.to_wire() if exc.report is not None else None
    return respond({"error": error, "report": report}, status=422)
