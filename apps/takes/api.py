"""/v1/takes and /v1/assets. Front door only: parse, call one service or selector, shape."""

from __future__ import annotations

import mimetypes
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from ninja import File, Router
from ninja.files import UploadedFile

from apps.takes.media import poster_png
from apps.takes.schemas import AssetOut, TakeOut
from apps.takes.selectors import asset_get_for_user, take_get_for_user
from apps.takes.serve import blob_response
from apps.takes.services import UploadRejected, asset_create
from apps.takes.storage import BlobMissing, blob_path
from apps.takes.wire import asset_to_wire, take_to_wire
from inline_farm.endpoints import ApiError, caller, errors, respond
from inline_farm.ids import is_uuid

takes_router = Router(tags=["takes"])
assets_router = Router(tags=["assets"])


@takes_router.get("/{take_id}", summary="A take's metadata and lineage",
                  response={200: TakeOut, **errors(401, 404)})
def get_take(request: HttpRequest, take_id: str) -> dict[str, Any]:
    return take_to_wire(_take_or_404(request, take_id))


_BYTES = {"type": "string", "format": "binary"}


@takes_router.get(
    "/{take_id}/bytes", summary="A take's bytes (ETag = sha256; Range for one byte range)",
    response={200: None, 206: None, 304: None, **errors(401, 404, 416)},
    openapi_extra={"responses": {
        200: {"description": "The take's bytes, with its media type",
              "content": {"application/octet-stream": {"schema": _BYTES}}},
        206: {"description": "The byte range asked for (Content-Range says which)",
              "content": {"application/octet-stream": {"schema": _BYTES}}},
    }},
)
def get_take_bytes(request: HttpRequest, take_id: str) -> HttpResponseBase:
    take = _take_or_404(request, take_id)
    try:
        return blob_response(request, sha256=take.sha256, media_type=take.media_type,
                             filename=f"{take.id}{_suffix(take.media_type)}")
    except BlobMissing as exc:
        raise ApiError(500, "blob_missing", str(exc)) from None


@takes_router.get(
    "/{take_id}/poster", summary="A PNG that stands for the take: a clip's first frame, an "
    "image scaled to fit 512 px", response={200: None, 304: None, **errors(401, 404)},
    openapi_extra={"responses": {200: {"description": "The poster (ETag: the take's sha256)",
                                       "content": {"image/png": {"schema": _BYTES}}}}},
)
def get_take_poster(request: HttpRequest, take_id: str) -> HttpResponseBase:
    take = _take_or_404(request, take_id)
    etag = f'"{take.sha256}-poster"'
    headers = {"ETag": etag, "Cache-Control": "private, max-age=31536000, immutable"}
    if etag in request.headers.get("If-None-Match", ""):
        return HttpResponse(status=304, headers=headers)
    path = blob_path(take.sha256)
    if not path.exists():
        raise ApiError(500, "blob_missing", f"blob {take.sha256} is missing from {path.parent}")
    return HttpResponse(poster_png(path, take.media_type), content_type="image/png",
                        headers=headers)


@assets_router.post("", summary="Upload an image (PNG, JPEG, WebP), video (MP4, WebM) or sound "
                    "(MP3, WAV, FLAC, Ogg / Opus, M4A) asset (multipart field 'file')",
                    response={200: AssetOut, 201: AssetOut, **errors(400, 401, 413, 415, 422)})
def upload_asset(request: HttpRequest, file: File[UploadedFile]) -> HttpResponse:
    limit = _max_bytes()
    if file.size is not None and file.size > limit:
        raise ApiError(413, "too_large", f"upload is {file.size} bytes; the limit is {limit}")
    try:
        asset, created = asset_create(owner=caller(request), data=file.read(), filename=file.name or "")
    except UploadRejected as exc:
        raise ApiError(exc.status, exc.code, exc.message) from None
    return respond(asset_to_wire(asset), status=201 if created else 200)


@assets_router.get("/{asset_id}", summary="An asset's metadata",
                   response={200: AssetOut, **errors(401, 404)})
def get_asset(request: HttpRequest, asset_id: str) -> dict[str, Any]:
    asset = asset_get_for_user(user=caller(request), asset_id=asset_id) if is_uuid(asset_id) else None
    if asset is None:
        raise ApiError(404, "not_found", f"no asset {asset_id}")
    return asset_to_wire(asset)


def _take_or_404(request: HttpRequest, take_id: str) -> Any:
    take = take_get_for_user(user=caller(request), take_id=take_id) if is_uuid(take_id) else None
    if take is None:
        raise ApiError(404, "not_found", f"no take {take_id}")
    return take


def _max_bytes() -> int:
    from django.conf import settings

    return int(settings.INLINE_ASSET_MAX_BYTES)


def _suffix(media_type: str) -> str:
    return mimetypes.guess_extension(media_type) or ""
