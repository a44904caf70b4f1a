"""/v1/models: the node descriptors (with model pickers) and the registry version."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from ninja import Router

from apps.graphs.schemas import DescriptorOut, RegistryOut
from apps.graphs.selectors import descriptor_for_clients, registry_for_clients
from inline_farm.endpoints import ApiError, errors, respond

router = Router(tags=["models"])


@router.get("", summary="All node descriptors; ETag = registryVersion",
            response={200: RegistryOut, 304: None, **errors(401)})
def list_descriptors(request: HttpRequest) -> HttpResponse:
    body = registry_for_clients()
    etag = f'"{body["registryVersion"]}"'
    if request.headers.get("If-None-Match") == etag:
        return HttpResponse(status=304, headers={"ETag": etag})
    response = respond(body, status=200)
    response["ETag"] = etag
    return response


@router.get("/{path:node_type}", summary="One node descriptor",
            response={200: DescriptorOut, **errors(401, 404)})
def get_descriptor(request: HttpRequest, node_type: str) -> dict[str, Any]:
    body = descriptor_for_clients(node_type)
    if body is None:
        raise ApiError(404, "unknown_node_type", f"unknown node type {node_type!r}")
    return body
