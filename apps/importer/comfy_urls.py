"""Routes of the ComfyUI front door: `/comfy/` (Bearer token, or the Django session of a browser
logged in at /login/) and `/comfy/k/<key>/` (a client key in the URL), each also under `api/` as
ComfyUI's newer frontend prefixes its calls; ComfyUI's own editor at both bases."""

from __future__ import annotations

from typing import Any

from channels.auth import AuthMiddlewareStack
from django.urls import include, path, re_path

from apps.importer import comfy_api as views
from apps.importer import comfy_editor as editor
from apps.importer.comfy_ws import ComfyWsConsumer

_routes: list[Any] = [
    path("prompt", views.prompt),
    path("history", views.history),
    path("history/<str:prompt_id>", views.history_one),
    path("view", views.view),
    path("upload/image", views.upload_image),
    path("queue", views.queue),
    path("interrupt", views.interrupt),
    path("object_info", views.object_info_all),
    path("object_info/<str:node_class>", views.object_info_one),
    path("system_stats", views.system_stats),
    path("embeddings", views.embeddings),
    path("models", views.models),
    path("models/<str:folder>", views.models_in),
    # What the editor calls beyond the API (apps/importer/comfy_editor.py).
    path("users", editor.users),
    path("settings", editor.settings_all),
    path("settings/<path:setting>", editor.settings_one),
    path("userdata", editor.userdata_list),
    re_path(r"^userdata/(?P<file>.+)/move/(?P<dest>.+)$", editor.userdata_move),
    path("userdata/<path:file>", editor.userdata_file),
    path("jobs", editor.jobs),
    path("jobs/cancel", editor.jobs_cancel),
    path("jobs/<str:job_id>", editor.job),
    path("jobs/<str:job_id>/cancel", editor.job_cancel),
    path("experiment/models", editor.experiment_models),
    path("experiment/models/<str:folder>", editor.experiment_models_in),
    path("features", editor.features),
    path("extensions", editor.extensions),
    path("i18n", editor.i18n),
    path("workflow_templates", editor.workflow_templates),
    path("workflow_templates/<str:source>/<str:name>.json", editor.run_workflow),
    path("global_subgraphs", editor.global_subgraphs),
    path("global_subgraphs/<str:subgraph>", editor.global_subgraphs),
    path("view_metadata/<str:folder>", editor.view_metadata),
    path("templates/index.json", editor.templates_index),
    path("templates/index.<str:locale>.json", editor.templates_index),
    path("templates/<str:name>", editor.templates_file),
]

# The editor's page and files: after the API (a file never shadows a route).
_pages: list[Any] = [
    path("", editor.editor),
    path("<path:path>", editor.editor_file),
]

BASES = ("comfy/k/<str:key>/", "comfy/k/<str:key>/api/", "comfy/", "comfy/api/")
PAGE_BASES = ("comfy/k/<str:key>/", "comfy/")

urlpatterns: list[Any] = [
    path("login/", editor.FarmLoginView.as_view(), name="login"),
    *(path(base, include(_routes)) for base in BASES),
    *(path(base, include(_pages)) for base in PAGE_BASES),
]

# The session (the editor in a browser) is read from the cookie; comfy_ws.py checks the Origin.
websocket_urlpatterns: list[Any] = [
    path(f"{base}ws", AuthMiddlewareStack(ComfyWsConsumer.as_asgi())) for base in BASES]
