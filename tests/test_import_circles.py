"""No import circles: no module of the farm imports one that is still being executed.

A circle works or breaks by who is imported first (`import apps.runs.api` after django.setup()
once raised "partially initialized module" while importing urls.py first hid it). Each check
runs in a fresh interpreter that watches every import: when module A (ours) imports B (ours)
while B's own code is still running, A → B closes a circle. Importing a submodule while its
package's `__init__` runs is not one (Python always runs the package first). Every module of
the farm is imported, after django.setup(), in sorted order and again in reverse order.

A circle closed only by an import inside a function does not fail at import time, but it is
still two modules that cannot be understood apart: the static check reads every import
statement, in functions too, and finds none.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
OURS = ("inline_farm", "apps", "workers", "migrations")

_WATCH = r"""
import builtins, importlib, importlib.util, json, sys

OURS = tuple(sys.argv[2].split(","))
circles, failures = set(), {}
real_import = builtins.__import__


def ours(name):
    return bool(name) and name.split(".")[0] in OURS


def running(name):
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None)
    return module is not None and bool(getattr(spec, "_initializing", False))


def watched_import(name, globals=None, locals=None, fromlist=(), level=0):
    importer = (globals or {}).get("__name__", "")
    if ours(importer):
        target = importlib.util.resolve_name("." * level + name, globals.get("__package__")) \
            if level else name
        wanted = [f"{target}.{item}" for item in fromlist or () if item != "*"]
        busy = [t for t in [target, *wanted] if ours(t) and t != importer and running(t)]
        module = real_import(name, globals, locals, fromlist, level)
        for t in busy:
            submodule = t != target or (not fromlist and "." in name)
            is_parent = importer.startswith(t + ".")
            # `from pkg import sub` inside pkg/x.py while pkg runs is Python's package order;
            # `from pkg import attribute` while pkg runs, or any import of a running module
            # that is not a parent of the importer, is a circle.
            names_a_submodule = bool(fromlist) and all(f"{t}.{i}" in sys.modules for i in fromlist)
            if is_parent and (submodule or names_a_submodule or not fromlist):
                continue
            circles.add(f"{importer} -> {t}")
        return module
    return real_import(name, globals, locals, fromlist, level)


builtins.__import__ = watched_import
import django  # noqa: E402
django.setup()
modules = json.loads(sys.argv[1])
for name in modules:
    try:
        importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 — every failure is reported, not the first
        failures[name] = f"{type(exc).__name__}: {exc}"
print(json.dumps({"circles": sorted(circles), "failures": failures}))
"""


def _modules() -> list[str]:
    names = []
    for top in OURS:
        for path in (REPO / top).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return sorted(names)


def _watch(order: list[str]) -> dict[str, object]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "inline_farm.settings",
           "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", _WATCH, json.dumps(order), ",".join(OURS)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


# Modules that need what a CPU machine lacks (xfuser imports CUDA); every other one is imported.
NEEDS_CUDA = {"workers.parallel.xfuser_backend"}


@pytest.mark.parametrize("order", ["sorted", "reversed"])
def test_no_module_imports_one_that_is_still_running(order):
    modules = [m for m in _modules() if m not in NEEDS_CUDA]
    assert len(modules) > 150, modules  # every module of the farm, not a few
    found = _watch(modules if order == "sorted" else modules[::-1])
    assert found["failures"] == {}
    assert found["circles"] == []


def test_the_watch_sees_a_circle(tmp_path):
    """The check itself: a pair of modules that import each other is reported."""
    pkg = REPO / "workers" / "_circle_probe"
    pkg.mkdir()
    try:
        (pkg / "__init__.py").write_text("")
        (pkg / "a.py").write_text("from workers._circle_probe import b\nVALUE = 1\n")
        (pkg / "b.py").write_text("import workers._circle_probe.a\n")
        found = _watch(["workers._circle_probe.a"])
    finally:
        for f in pkg.glob("*.py"):
            f.unlink()
        for cache in pkg.glob("__pycache__/*"):
            cache.unlink()
        (pkg / "__pycache__").rmdir() if (pkg / "__pycache__").exists() else None
        pkg.rmdir()
    assert found["circles"] == ["workers._circle_probe.b -> workers._circle_probe.a"]


# --- every import statement, in functions too ---------------------------------------------------

def _imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The farm's modules that module `name` names in any import statement (the most specific
    known module; a parent package of `name` itself is Python's order, not an edge)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    named: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            named.update(f"{base}.{alias.name}" for alias in node.names)
    edges = set()
    for dotted in named:
        parts = dotted.split(".")
        found = next((".".join(parts[:i]) for i in range(len(parts), 0, -1)
                      if ".".join(parts[:i]) in known), None)
        if found and found != name and not name.startswith(found + "."):
            edges.add(found)
    return edges


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while (w := stack.pop()) != v:
                group.append(w)
            if group:
                groups.append(sorted([v, *group]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def _graph(names: list[str]) -> dict[str, set[str]]:
    known = set(names)
    paths = {n: REPO.joinpath(*n.split(".")) for n in names}
    return {n: _imports_of(n, p / "__init__.py" if p.is_dir() else p.with_suffix(".py"), known)
            for n, p in paths.items()}


def test_no_import_statement_anywhere_closes_a_circle():
    names = [m for m in _modules() if not m.startswith("migrations")]
    assert _circles(_graph(names)) == []


def test_the_static_check_sees_a_circle_through_a_function():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [["a", "b", "c"]]
