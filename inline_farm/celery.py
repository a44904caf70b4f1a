"""The Celery app. Workers: `celery -A inline_farm worker --pool=solo -Q cpu,control,…`."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inline_farm.settings")

app = Celery("inline_farm")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Tasks by module path: the web process publishes by name and never imports workers/.
# workers.parallel.worker: the start check of INLINE_PARALLEL and the group worker's hook.
app.conf.imports = ("apps.runs.tasks", "workers.tasks", "workers.parallel.worker")
