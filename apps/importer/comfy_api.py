"""ComfyUI's HTTP API on the farm (front door only: parse, call comfy_door, shape ComfyUI's way).

Mounted twice (apps/importer/comfy_urls.py): under `/comfy/` with the farm's API token as
`Authorization: Bearer <token>`, and under `/comfy/k/<key>/` with a client key in the URL for
clients that cannot send headers. Each also answers under `api/` as ComfyUI's newer frontend
calls it (`/comfy/api/prompt`). Refusals use ComfyUI's error shape, never a 500.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from collections.abc import Callable
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.multipartparser import MultiPartParserError
from django.http.response import HttpResponseBase
from django.views.decorators.csrf import csrf_exempt

from apps.accounts.selectors import user_for_token
from apps.fleet.selectors import model_catalog, workers_live
from apps.graphs.schema import text_problem
from apps.importer.comfy_door import (
    PromptIn,
    comfy_history_entry_for_user,
    comfy_history_for_user,
    comfy_history_remove,
    comfy_input_asset,
    comfy_interrupt,
    comfy_prompt_queue,
    comfy_queue_delete,
    comfy_queue_for_user,
    comfy_queue_remaining,
    comfy_upload_keep,
    comfy_upload_names,
    user_for_comfy_key,
)
from apps.importer.comfy_object_info import object_info
from apps.importer.comfy_shapes import (
    ComfyRefused,
    error,
    history_entry,
    queue_item,
    unmapped_node_errors,
)
from apps.takes.selectors import take_get_for_user
from apps.takes.serve import blob_response
from apps.takes.services import UploadRejected
from apps.takes.storage import BlobMissing
from inline_farm.ids import is_uuid
from inline_farm.jsondoc import JsonUnreadable, json_parse, json_problem, printable

View = Callable[..., HttpResponseBase]
VERSION = "0.3.64"  # the ComfyUI API this door speaks
MAX_HISTORY = 1000


MAX_OFFSET = 2**31  # /history's `offset` past any history a user has: an empty answer
# No number a ComfyUI client sends is larger (a seed is at most 2**64 − 1); a larger one in any
# field, even one the farm ignores, is refused rather than stored.
MAX_NUMBER = 2**64


def _refusal(status: int, type: str, message: str) -> JsonResponse:
    return JsonResponse({"error": error(type, message, message), "node_errors": {}},
                        status=status)


class BadInput(Exception):
    """A request the door refuses before any read or write (answered 400, ComfyUI's shape):
    text PostgreSQL cannot store, a number JSON cannot hold, a body nested too deep."""

    def __init__(self, message: str, node_errors: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message, self.node_errors = message, node_errors or {}

    def response(self) -> JsonResponse:
        return JsonResponse({"error": error("bad_request", self.message, self.message),
                             "node_errors": self.node_errors}, status=400)


def _check_text(where: str, value: str) -> None:
    problem = text_problem(value)
    if problem is not None:
        raise BadInput(f"{printable(where)}: text {problem}")


def _check_request(request: HttpRequest, kwargs: dict[str, Any]) -> None:
    """Every field the farm might read, including those it ignores: the query string, form
    fields and file names of a multipart body, and the path's own parts."""
    for name, value in kwargs.items():
        _check_text(name, str(value))
    fields = [request.GET]
    if request.method == "POST" and request.content_type == "multipart/form-data":
        try:
            fields.append(request.POST)
            for name, uploads in request.FILES.lists():
                for upload in uploads:
                    _check_text(name, upload.name or "")
        except MultiPartParserError as exc:
            raise BadInput(f"unreadable multipart body: {exc}") from None
    for query in fields:
        for name, values in query.lists():
            _check_text("parameter name", name)
            for value in values:
                _check_text(name, value)


def comfy_user(request: HttpRequest, key: str | None) -> User | None:
    """The caller: the client key of the base URL, else the Bearer token, else (the editor in
    a browser) the Django session of a same-origin request."""
    if key is not None:
        return user_for_comfy_key(key)
    scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and secret.strip():
        return user_for_token(secret.strip())
    return session_user(request)


_BASE = re.compile(r"^(.*?/comfy/(?:k/[^/]+/)?(?:api/)?)")


def door_base(request: HttpRequest) -> str:
    """The door's base as this caller reached it (`/comfy/`, `/comfy/api/`, `/comfy/k/<key>/`,
    …, behind any script prefix): links the farm hands back work with the caller's own
    credential (the session, or the key in the URL)."""
    found = _BASE.match(request.path)
    return found.group(1) if found else "/comfy/api/"


def session_user(request: HttpRequest) -> User | None:
    """The logged-in user of the session cookie. A request that changes something must come
    from the farm's own pages (same origin): the door skips Django's CSRF token, which
    ComfyUI's editor does not send, so the Origin header is what stops another site."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated or not user.is_active:
        return None
    if request.method not in ("GET", "HEAD", "OPTIONS") and not same_origin(
            request.headers.get("Origin"), request.get_host(), request.headers.get("Sec-Fetch-Site")):
        return None
    assert isinstance(user, User)
    return user


def same_origin(origin: str | None, host: str, fetch_site: str | None) -> bool:
    """Whether a browser request came from a page of `host` (its Origin header, else the
    Fetch metadata a browser sends on every request)."""
    if origin:
        return origin.split("://", 1)[-1] == host
    return fetch_site in ("same-origin", "none")


def door(*methods: str) -> Callable[[View], View]:
    """Authenticate, allow `methods`, and never answer a refusal outside ComfyUI's shape."""

    def wrap(view: View) -> View:
        @csrf_exempt
        def handle(request: HttpRequest, key: str | None = None, **kwargs: Any) -> HttpResponseBase:
            if request.method not in methods:
                response = _refusal(405, "method_not_allowed", f"{request.method} is not allowed")
                response["Allow"] = ", ".join(methods)
                return response
            user = comfy_user(request, key) if key is None or text_problem(key) is None else None
            if user is None:
                return _refusal(401, "unauthorized", "send 'Authorization: Bearer <token>', "
                                "use a base URL with a client key (/comfy/k/<key>/), or log "
                                "in at /login/")
            try:
                _check_request(request, kwargs)
                return view(request, user, **kwargs)
            except BadInput as bad:
                return bad.response()
            except RequestDataTooBig:
                return _refusal(413, "too_large", "the request body is over the size limit")

        handle.__name__ = view.__name__
        handle.__doc__ = view.__doc__
        return handle

    return wrap


def _json_body(request: HttpRequest, *, check: bool = True) -> Any:
    """The body's JSON document (the farm's one rule: inline_farm/jsondoc.py); BadInput when it
    is unreadable or, with `check`, holds anything PostgreSQL could not store."""
    try:
        document = json_parse(request.body or b"{}")
    except JsonUnreadable as exc:
        raise BadInput(f"unreadable JSON body: {exc}") from None
    if check:
        _check_json("body", document)
    return document


def _check_json(what: str, document: Any, node_id: str | None = None) -> None:
    found = json_problem(document, magnitude=MAX_NUMBER)
    if found is None:
        return
    where, why = found
    message = f"{what}{'.' + where if where else ''}: {why}"
    if node_id is None:
        raise BadInput(message)
    raise BadInput(message, {node_id: {"errors": [error("bad_request", message, message)],
                                       "dependent_outputs": [], "class_type": _class_type(
                                           document)}})


def _class_type(node: Any) -> str:
    kind = node.get("class_type") if isinstance(node, dict) else None
    return kind if isinstance(kind, str) and text_problem(kind) is None else ""


def _check_prompt_body(body: dict[str, Any]) -> None:
    """A refusal naming the node (as ComfyUI's node_errors do) when one holds what cannot be
    stored; then every other field, the ones the farm ignores included."""
    prompt = body["prompt"]
    for node_id, node in prompt.items():
        _check_text("prompt: a node id", str(node_id))
        _check_json(f"prompt.{node_id}", node, str(node_id))
    _check_json("body", {k: v for k, v in body.items() if k != "prompt"})


@door("GET", "POST")
def prompt(request: HttpRequest, user: User) -> HttpResponse:
    """POST: queue a workflow (API format) → {prompt_id, number, node_errors}. GET: the queue
    size, as ComfyUI's `GET /prompt` answers it."""
    if request.method == "GET":
        return JsonResponse({"exec_info": {"queue_remaining": comfy_queue_remaining(user=user)}})
    body = _json_body(request, check=False)
    if not isinstance(body, dict) or not isinstance(body.get("prompt"), dict):
        _check_json("body", body)
        return JsonResponse({"error": error("no_prompt", "No prompt provided",
                                            "No prompt provided"), "node_errors": {}}, status=400)
    _check_prompt_body(body)
    pid = body.get("prompt_id")
    if pid is not None and not is_uuid(pid):
        return _refusal(400, "invalid_prompt", "prompt_id must be a UUID in canonical form "
                        "(lowercase, hyphenated)")
    extra = body.get("extra_data")
    client_id = body.get("client_id")
    try:
        queued, unmapped = comfy_prompt_queue(owner=user, body=PromptIn(
            prompt=body["prompt"],
            client_id=client_id[:200] if isinstance(client_id, str) else "",
            extra_data=extra if isinstance(extra, dict) else None,
            prompt_id=str(pid) if pid is not None else None))
    except ComfyRefused as refused:
        return JsonResponse(refused.body(), status=refused.status)
    return JsonResponse({"prompt_id": str(queued.id), "number": queued.number,
                         "node_errors": unmapped_node_errors(unmapped)})


@door("GET", "POST")
def history(request: HttpRequest, user: User) -> HttpResponse:
    """GET: finished prompts, oldest first (`max_items`, `offset`). POST `{delete: [ids]}` /
    `{clear: true}`: hide them from this user's history (and /api/jobs) for good; the runs and
    takes are the farm's record and stay."""
    if request.method == "POST":
        body = _json_body(request)
        if isinstance(body, dict):
            delete = body.get("delete")
            comfy_history_remove(user=user, prompt_ids=[str(i) for i in delete]
                                 if isinstance(delete, list) else None,
                                 clear=body.get("clear") is True)
        return HttpResponse(status=200)
    try:
        limit = min(int(request.GET.get("max_items") or MAX_HISTORY), MAX_HISTORY)
        offset = max(int(request.GET.get("offset") or 0), 0)
    except ValueError:
        return _refusal(400, "bad_request", "max_items and offset must be integers")
    if offset > MAX_OFFSET:  # no history is that long; PostgreSQL's OFFSET takes a bigint
        return JsonResponse({})
    prompts = comfy_history_for_user(user=user, max_items=max(limit, 0), offset=offset)
    base = door_base(request)
    return JsonResponse({str(p.id): history_entry(p, base) for p in prompts})


@door("GET")
def history_one(request: HttpRequest, user: User, prompt_id: str) -> HttpResponse:
    """One prompt's history once it finished; `{}` while it runs, when it is not yours or once
    you removed it from your history."""
    found = comfy_history_entry_for_user(user=user, prompt_id=prompt_id)
    if found is None:
        return JsonResponse({})
    return JsonResponse({str(found.id): history_entry(found, door_base(request))})


@door("GET")
def view(request: HttpRequest, user: User) -> HttpResponseBase:
    """An output image (a take, by the id in its file name) or an uploaded input's bytes."""
    filename = request.GET.get("filename", "")
    kind = request.GET.get("type", "output")
    if not filename or filename.startswith("/") or ".." in filename:
        return HttpResponse(status=400 if filename else 404)
    if kind == "input":
        asset = comfy_input_asset(user=user, filename=filename,
                                  subfolder=request.GET.get("subfolder", ""))
        found = (asset.sha256, asset.media_type) if asset is not None else None
    else:
        stem = os.path.splitext(os.path.basename(filename))[0]
        take = take_get_for_user(user=user, take_id=stem) if is_uuid(stem) else None
        found = (take.sha256, take.media_type) if take is not None else None
    if found is None:
        return HttpResponse(status=404)
    try:  # streamed, with Range (inline_farm/asgi.py sends /view to Django's ASGI handler)
        return blob_response(request, sha256=found[0], media_type=found[1],
                             filename=os.path.basename(filename))
    except BlobMissing:
        return HttpResponse(status=404)


@door("POST")
def upload_image(request: HttpRequest, user: User) -> HttpResponse:
    """Multipart `image` (+ `subfolder`, `overwrite`, `type`) → `{name, subfolder, type}`;
    LoadImage can then name it."""
    image = request.FILES.get("image")
    if image is None or not image.name:
        return HttpResponse(status=400)
    try:
        upload = comfy_upload_keep(
            owner=user, data=image.read(), filename=image.name,
            subfolder=request.POST.get("subfolder", ""),
            overwrite=request.POST.get("overwrite") in ("true", "1"))
    except UploadRejected as exc:
        return _refusal(exc.status, exc.code, exc.message)
    return JsonResponse({"name": upload.name, "subfolder": upload.subfolder, "type": "input"})


@door("GET", "POST")
def queue(request: HttpRequest, user: User) -> HttpResponse:
    """GET: running and pending prompts. POST {delete: [ids]} / {clear: true}: drop pending."""
    if request.method == "POST":
        body = _json_body(request)
        if isinstance(body, dict):
            delete = body.get("delete")
            comfy_queue_delete(user=user, prompt_ids=[str(i) for i in delete]
                               if isinstance(delete, list) else None,
                               clear=body.get("clear") is True)
        return HttpResponse(status=200)
    running, pending = comfy_queue_for_user(user=user)
    return JsonResponse({"queue_running": [queue_item(p) for p in running],
                         "queue_pending": [queue_item(p) for p in pending]})


@door("POST")
def interrupt(request: HttpRequest, user: User) -> HttpResponse:
    """Stop the caller's executing prompts, or only `{prompt_id}`'s."""
    body = _json_body(request)
    pid = body.get("prompt_id") if isinstance(body, dict) else None
    comfy_interrupt(user=user, prompt_id=str(pid) if pid else None)
    return HttpResponse(status=200)


@door("GET")
def object_info_all(request: HttpRequest, user: User) -> HttpResponse:
    return JsonResponse(object_info(catalog=model_catalog(), uploads=comfy_upload_names(user=user)))


@door("GET")
def object_info_one(request: HttpRequest, user: User, node_class: str) -> HttpResponse:
    info = object_info(catalog=model_catalog(), uploads=comfy_upload_names(user=user))
    return JsonResponse({node_class: info[node_class]} if node_class in info else {})


@door("GET")
def system_stats(request: HttpRequest, user: User) -> HttpResponse:
    """ComfyUI's keys, one device per live worker (the farm's GPUs). Host details (this web
    host's RAM, OS, Python, the workers' names) are for staff; a plain user's client gets the
    same keys with neutral values, which is all a ComfyUI client reads them for."""
    staff = user.is_staff
    devices = []
    for index, worker in enumerate(workers_live().order_by("name")):
        device = worker.device or {}
        vram = int(float(device.get("vram_gb") or 0) * 2**30)
        name = str(device.get("device_name", "cpu"))
        devices.append({
            "name": f"{worker.name}: {name}" if staff else name,
            "type": str(device.get("device", "cpu")).split(":")[0], "index": index,
            "vram_total": vram, "vram_free": vram, "torch_vram_total": vram,
            "torch_vram_free": vram})
    system: dict[str, Any] = {
        "os": "", "ram_total": 0, "ram_free": 0, "comfyui_version": VERSION,
        "python_version": "", "pytorch_version": "", "embedded_python": False, "argv": [],
        "farm": "inline-farm"}
    if staff:
        system.update({"os": os.name, "ram_total": _ram("SC_PHYS_PAGES"),
                       "ram_free": _ram("SC_AVPHYS_PAGES"), "python_version": sys.version,
                       "platform": platform.platform()})
    return JsonResponse({"system": system, "devices": devices})


def _ram(pages: str) -> int:
    try:
        return int(os.sysconf(pages) * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 0


@door("GET")
def embeddings(request: HttpRequest, user: User) -> HttpResponse:
    return JsonResponse([], safe=False)


@door("GET")
def models(request: HttpRequest, user: User) -> HttpResponse:
    """The model folders live workers hold files in (ComfyUI's `GET /models`)."""
    return JsonResponse(list(model_catalog()), safe=False)


@door("GET")
def models_in(request: HttpRequest, user: User, folder: str) -> HttpResponse:
    """The files live workers hold in one folder; 404 for a folder nobody holds."""
    catalog = model_catalog()
    if folder not in catalog:
        return HttpResponse(status=404)
    return JsonResponse(catalog[folder], safe=False)
