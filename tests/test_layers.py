"""The web side imports no torch, and every runnable node type has exactly one runner."""

from __future__ import annotations

import subprocess
import sys

from tests.livefarm import REPO

WEB_IMPORTS = """
import sys, django, importlib, pkgutil
django.setup()
import inline_farm.asgi, inline_farm.urls
import apps
for mod in pkgutil.walk_packages(apps.__path__, "apps."):
    importlib.import_module(mod.name)
heavy = sorted(m for m in ("torch", "diffusers", "transformers", "safetensors") if m in sys.modules)
print(",".join(heavy) or "clean")
"""


def test_the_web_process_imports_no_torch():
    out = subprocess.run(
        [sys.executable, "-c", WEB_IMPORTS], cwd=REPO, capture_output=True, text=True, check=True,
        env={**__import__("os").environ, "DJANGO_SETTINGS_MODULE": "inline_farm.settings"},
    )
    assert out.stdout.strip().splitlines()[-1] == "clean", out.stdout + out.stderr


def test_every_runnable_descriptor_has_a_runner_and_every_runner_a_descriptor():
    from apps.graphs.registry import REGISTRY
    from workers.runners import RUNNERS

    runnable = {t for t, d in REGISTRY.items() if d.runnable}
    assert runnable == set(RUNNERS)
