"""/v1/models: the node descriptors (with model pickers) and the registry version."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from ninja import Router

from apps.graphs.schemas import DescriptorOut, ModelFilesOut, RegistryOut
from apps.graphs.selectors import descriptor_for_clients, model_files_live, registry_for_clients
from inline_farm.endpoints import ApiError, errors, respond

router = Router(tags=["models"])


@router.get("", summary="All node descriptors; ETag = registryVersion",
            response={200: RegistryOut, 304: None, **errors(401)})
def list_descriptors(request: HttpRequest, family: str | None = None) -> HttpResponse:
    """`?family=flux1`: model pickers list only that family's files."""
    body = registry_for_clients(family)
    etag = f'"{body["registryVersion"]}"'
    if request.headers.get("If-None-Match") == etag:
        return HttpResponse(status=304, headers={"ETag": etag})
    response = respond(body, status=200)
    response["ETag"] = etag
    return response


@router.get("/files", summary="The model files live workers hold: family and role of each",
            response={200: ModelFilesOut, **errors(401)})
def list_model_files(request: HttpRequest, family: str | None = None) -> dict[str, Any]:
    """Each file's `family` and `role` come from its contents (the workers read its keys);
    `?family=` keeps one family's files."""
    return {"files": [f.to_wire() for f in model_files_live(family).values()]}


@router.get("/{path:node_type}", summary="One node descriptor",
            response={200: DescriptorOut, **errors(401, 404)})
def get_descriptor(request: HttpRequest, node_type: str,
                   family: str | None = None) -> dict[str, Any]:
    body = descriptor_for_clients(node_type, family)
    if body is None:
        raise ApiError(404, "unknown_node_type", f"unknown node type {node_type!r}")
    return body
