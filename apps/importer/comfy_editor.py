"""ComfyUI's own editor, served by the farm at `/comfy/` (Django session: log in at `/login/`)
and at each client key's `/comfy/k/<key>/`, from the pinned `comfyui-frontend-package` (no CDN).

Front door only: the page and its static files, and the endpoints the editor calls beyond
ComfyUI's API (comfy_api.py): the user's settings and files (comfy_userdata.py), the jobs of
the queue and history panels (comfy_jobs.py), templates (comfy_templates.py), and the empty
answers ComfyUI gives for a feature it does not have (extensions, i18n, …).
"""

from __future__ import annotations

import json
import mimetypes
from pathlib import Path
from typing import Any
from urllib.parse import quote

import comfyui_frontend_package
from django.conf import settings
from django.contrib.auth.models import User
from django.contrib.auth.views import LoginView
from django.http import (
    FileResponse,
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseRedirect,
    JsonResponse,
)
from django.http.response import HttpResponseBase
from django.views.decorators.http import require_GET

from apps.fleet.selectors import model_catalog
from apps.importer.comfy_api import BadInput, comfy_user, door, door_base
from apps.importer.comfy_door import comfy_prompt_get_for_user
from apps.importer.comfy_jobs import (
    MAX_LIMIT,
    comfy_job_get_for_user,
    comfy_jobs_cancel,
    comfy_jobs_for_user,
    job_detail,
    job_item,
)
from apps.importer.comfy_shapes import error
from apps.importer.comfy_templates import template_file, template_index
from apps.importer.comfy_userdata import (
    UserFileExists,
    UserPathInvalid,
    UserQuotaExceeded,
    comfy_settings_get,
    comfy_settings_update,
    comfy_userfile_delete,
    comfy_userfile_get,
    comfy_userfile_list,
    comfy_userfile_move,
    comfy_userfile_put,
)
from inline_farm.jsondoc import JsonUnreadable, json_parse

STATIC = Path(comfyui_frontend_package.__file__).resolve().parent / "static"
HASHED_MAX_AGE = 365 * 24 * 3600  # assets/ names carry their content hash
PLAIN_MAX_AGE = 3600


# --- the page and its files -------------------------------------------------------------------

@require_GET
def editor(request: HttpRequest, key: str | None = None) -> HttpResponseBase:
    """The editor's page, for a caller the farm knows; the cookie case goes through /login/."""
    if comfy_user(request, key) is None:
        if key is not None:
            return HttpResponse("this client key is not valid (revoked?)", status=401,
                                content_type="text/plain")
        return HttpResponseRedirect(f"{settings.LOGIN_URL}?next={quote(request.path)}")
    response = FileResponse((STATIC / "index.html").open("rb"), content_type="text/html")
    response["Cache-Control"] = "no-store"  # who may see the editor changes; its files do not
    return response


@require_GET
def editor_file(request: HttpRequest, path: str, key: str | None = None) -> HttpResponseBase:
    """One file of the frontend package (public code, as any ComfyUI serves it)."""
    found = (STATIC / path).resolve()
    if not found.is_relative_to(STATIC) or not found.is_file():
        raise Http404(path)
    media_type = mimetypes.guess_type(found.name)[0] or "application/octet-stream"
    if found.suffix in (".js", ".mjs"):
        media_type = "text/javascript"
    response = FileResponse(found.open("rb"), content_type=media_type)
    age = HASHED_MAX_AGE if path.startswith("assets/") else PLAIN_MAX_AGE
    response["Cache-Control"] = f"public, max-age={age}" + (
        ", immutable" if age == HASHED_MAX_AGE else "")
    return response


class FarmLoginView(LoginView):
    """The farm's login page for the editor (any active user, unlike the admin's)."""

    template_name = "admin/login.html"
    redirect_authenticated_user = True
    extra_context = {"site_header": "Inline Farm", "site_title": "Inline Farm",
                     "title": "Log in to the ComfyUI editor"}

    def get_default_redirect_url(self) -> str:
        return "/comfy/"


# --- the user directory: /users, /settings, /userdata ----------------------------------------

@door("GET", "POST")
def users(request: HttpRequest, user: User) -> HttpResponse:
    """The farm knows its user from the credential: the editor's single-user answer."""
    if request.method == "POST":
        return JsonResponse({"error": "users are managed by the farm"}, status=400)
    return JsonResponse({"storage": "server", "migrated": True})


def _over_quota(exc: UserQuotaExceeded) -> JsonResponse:
    """ComfyUI's error shape, 507 Insufficient Storage (as WebDAV servers answer a quota): the
    editor's save fails and nothing was written. The editor reads no body of a failed write: its
    dialog says "Error storing user data file '<file>': <status> <reason>", and uvicorn sends
    the standard reason phrase, so the status is the only word that reaches it — 413 would read
    "Request Entity Too Large" for a file of a few bytes; the body's message is for scripts."""
    return JsonResponse({"error": error("quota_exceeded", str(exc), str(exc)), "node_errors": {}},
                        status=507)


def _body_json(request: HttpRequest) -> Any:
    try:
        return json_parse(request.body or b"null")
    except JsonUnreadable as exc:
        raise BadInput(f"unreadable JSON body: {exc}") from None


@door("GET", "POST")
def settings_all(request: HttpRequest, user: User) -> HttpResponse:
    if request.method == "POST":
        values = _body_json(request)
        if not isinstance(values, dict):
            raise BadInput("settings must be a JSON object")
        try:
            comfy_settings_update(user=user, values=values)
        except UserQuotaExceeded as exc:
            return _over_quota(exc)
        return HttpResponse(status=200)
    return JsonResponse(comfy_settings_get(user=user))


@door("GET", "POST")
def settings_one(request: HttpRequest, user: User, setting: str) -> HttpResponse:
    if request.method == "POST":
        try:
            comfy_settings_update(user=user, values={setting: _body_json(request)})
        except UserQuotaExceeded as exc:
            return _over_quota(exc)
        return HttpResponse(status=200)
    return JsonResponse(comfy_settings_get(user=user).get(setting), safe=False)


def _flag(request: HttpRequest, name: str, default: bool) -> bool:
    raw = request.GET.get(name)
    return default if raw is None else raw.lower() in ("true", "1")


@door("GET")
def userdata_list(request: HttpRequest, user: User) -> HttpResponse:
    """`?dir=&recurse=&full_info=&split=`: the files under a directory, 404 when it has none."""
    try:
        found = comfy_userfile_list(user=user, directory=request.GET.get("dir", ""),
                                    recurse=_flag(request, "recurse", False))
    except UserPathInvalid as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    if found is None:
        return JsonResponse({"error": "directory not found"}, status=404)
    if _flag(request, "full_info", False):
        return JsonResponse([f.as_json() for f in found], safe=False)
    if _flag(request, "split", False):
        return JsonResponse([[f.path, *f.path.split("/")] for f in found], safe=False)
    return JsonResponse([f.path for f in found], safe=False)


@door("GET", "POST", "DELETE")
def userdata_file(request: HttpRequest, user: User, file: str) -> HttpResponse:
    try:
        if request.method == "GET":
            content = comfy_userfile_get(user=user, path=file)
            if content is None:
                return JsonResponse({"error": "file not found"}, status=404)
            kind = mimetypes.guess_type(file)[0] or "application/octet-stream"
            return HttpResponse(content, content_type=kind)
        if request.method == "DELETE":
            found = comfy_userfile_delete(user=user, path=file)
            return HttpResponse(status=204 if found else 404)
        info = comfy_userfile_put(user=user, path=file, content=request.body,
                                  overwrite=_flag(request, "overwrite", True))
    except UserPathInvalid as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    except UserFileExists:
        return JsonResponse({"error": "file exists"}, status=409)
    except UserQuotaExceeded as exc:
        return _over_quota(exc)
    if _flag(request, "full_info", False):
        return JsonResponse(info.as_json())
    return JsonResponse(info.path, safe=False)


@door("POST")
def userdata_move(request: HttpRequest, user: User, file: str, dest: str) -> HttpResponse:
    try:
        info = comfy_userfile_move(user=user, source=file, dest=dest,
                                   overwrite=_flag(request, "overwrite", False))
    except UserPathInvalid as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    except UserFileExists:
        return JsonResponse({"error": "file exists"}, status=409)
    if info is None:
        return JsonResponse({"error": "file not found"}, status=404)
    if _flag(request, "full_info", False):
        return JsonResponse(info.as_json())
    return JsonResponse(info.path, safe=False)


# --- the queue and history panels: /jobs -------------------------------------------------------

def _int(request: HttpRequest, name: str, default: int, top: int) -> int:
    try:
        return max(0, min(int(request.GET.get(name) or default), top))
    except ValueError:
        raise BadInput(f"{name} must be an integer") from None


@door("GET")
def jobs(request: HttpRequest, user: User) -> HttpResponse:
    """`?status=a,b&limit=&offset=`: the user's own jobs, newest first."""
    statuses = [s for s in request.GET.get("status", "").split(",") if s]
    limit = _int(request, "limit", 100, MAX_LIMIT)
    offset = _int(request, "offset", 0, 2**31)
    page, total = comfy_jobs_for_user(user=user, statuses=statuses, limit=limit, offset=offset)
    base = door_base(request)
    return JsonResponse({
        "jobs": [job_item(p, base=base, staff=user.is_staff) for p in page],
        "pagination": {"offset": offset, "limit": limit, "total": total,
                       "has_more": offset + len(page) < total}})


@door("GET")
def job(request: HttpRequest, user: User, job_id: str) -> HttpResponse:
    found = comfy_job_get_for_user(user=user, job_id=job_id)
    if found is None:
        return JsonResponse({"error": "job not found"}, status=404)
    return JsonResponse(job_detail(found, base=door_base(request), staff=user.is_staff))


@door("POST")
def jobs_cancel(request: HttpRequest, user: User) -> HttpResponse:
    body = _body_json(request)
    ids = body.get("job_ids") if isinstance(body, dict) else None
    if not isinstance(ids, list):
        raise BadInput("send {job_ids: [...]}")
    return JsonResponse({"cancelled": comfy_jobs_cancel(user=user, job_ids=[str(i) for i in ids])})


@door("POST")
def job_cancel(request: HttpRequest, user: User, job_id: str) -> HttpResponse:
    return JsonResponse({"cancelled": comfy_jobs_cancel(user=user, job_ids=[job_id])})


# --- models, features, templates and ComfyUI's empty answers ---------------------------------

@door("GET")
def experiment_models(request: HttpRequest, user: User) -> HttpResponse:
    return JsonResponse([{"name": folder, "folders": [folder]} for folder in model_catalog()],
                        safe=False)


@door("GET")
def experiment_models_in(request: HttpRequest, user: User, folder: str) -> HttpResponse:
    catalog = model_catalog()
    if folder not in catalog:
        return JsonResponse({"error": "no such folder"}, status=404)
    return JsonResponse([{"name": name, "pathIndex": 0} for name in catalog[folder]], safe=False)


@door("GET")
def features(request: HttpRequest, user: User) -> HttpResponse:
    return JsonResponse({"supports_preview_metadata": False,
                         "max_upload_size": settings.INLINE_ASSET_MAX_BYTES})


def _empty(answer: Any) -> Any:
    @door("GET")
    def view(request: HttpRequest, user: User, **_: Any) -> HttpResponse:
        return JsonResponse(answer, safe=False)

    return view


extensions = _empty([])  # no custom-node JavaScript: the farm runs only its own nodes
i18n = _empty({})
workflow_templates = _empty({})  # custom nodes' templates: none
global_subgraphs = _empty({})


RUNS_SOURCE = "farm-runs"  # `?template=<prompt id>&source=farm-runs` opens a run's workflow


def editor_url_for_prompt(prompt_id: str) -> str:
    """The editor, opening the workflow a prompt was queued from (the template URL loader)."""
    return f"/comfy/?template={prompt_id}&source={RUNS_SOURCE}"


def workflow_url_for_prompt(prompt_id: str) -> str:
    return f"/comfy/api/workflow_templates/{RUNS_SOURCE}/{prompt_id}.json"


@door("GET")
def run_workflow(request: HttpRequest, user: User, source: str, name: str) -> HttpResponse:
    """The editor workflow a prompt was queued with (its `extra_pnginfo`), for whoever may see
    the prompt (owner, team, staff); 404 for anything else, as for a template nobody has."""
    prompt = comfy_prompt_get_for_user(user=user, prompt_id=name) if source == RUNS_SOURCE else None
    workflow = ((prompt.extra_data or {}).get("extra_pnginfo") or {}).get("workflow") if prompt else None
    if not isinstance(workflow, dict):
        return JsonResponse({"error": "no editor workflow for this run"}, status=404)
    return JsonResponse(workflow)


@door("GET")
def view_metadata(request: HttpRequest, user: User, folder: str) -> HttpResponse:
    return HttpResponse(status=404)  # model metadata: the editor reads an empty body as none


@door("GET")
def templates_index(request: HttpRequest, user: User, locale: str = "") -> HttpResponse:
    """The templates browser: workflows that run on this farm (comfy_templates.py)."""
    index = template_index(locale)
    if index is None:
        return JsonResponse({"error": f"no index for locale {locale!r}"}, status=404)
    return HttpResponse(json.dumps(index), content_type="application/json")


@door("GET")
def templates_file(request: HttpRequest, user: User, name: str) -> HttpResponseBase:
    found = template_file(name)
    if found is None:
        return JsonResponse({"error": "no such template"}, status=404)
    content, media_type = found
    return HttpResponse(content, content_type=media_type)
