"""The importer bounds its work before it expands a workflow (no database): a subgraph bomb is
refused naming the subgraph after a few hundred lines of the importer's code, and real
workflows still import.

Work is counted as the lines of apps/importer/ executed (sys.settrace): deterministic, where a
time would measure the machine as much as the code."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from apps.importer.report import ImportInvalid
from apps.importer.services import comfy_import, workflow_parse
from tests.apps.importer.builder import CATALOG, bomb, turbo_ui, workflow

IMPORTER = str(Path(__file__).resolve().parents[3] / "apps" / "importer")


def importer_lines(doc: Any) -> tuple[int, ImportInvalid | None]:
    """How many lines of the importer importing `doc` executes, and what it refused."""
    lines = 0

    def line(frame: Any, event: str, arg: Any) -> Any:
        nonlocal lines
        lines += event == "line"
        return line

    def call(frame: Any, event: str, arg: Any) -> Any:
        return line if frame.f_code.co_filename.startswith(IMPORTER) else None

    refused = None
    sys.settrace(call)
    try:
        comfy_import(workflow=doc, catalog=CATALOG)
    except ImportInvalid as exc:
        refused = exc
    finally:
        sys.settrace(None)
    return lines, refused


def refused_within(doc: Any, lines: int) -> ImportInvalid:
    """`doc` is refused after at most `lines` lines of the importer (a bomb: ~450)."""
    done, refused = importer_lines(doc)
    assert refused is not None, "imported"
    assert done < lines, f"{done} lines of the importer ran before the refusal"
    return refused


@pytest.mark.parametrize(("levels", "fanout"), [(4, 10), (13, 2)])
def test_a_subgraph_bomb_is_refused_too_large_naming_the_subgraph_in_well_under_a_second(
        levels, fanout):
    err = refused_within(bomb(levels, fanout), 2_000)
    assert err.code == "too_large" and "subgraph 'sg" in err.message
    assert "INLINE_IMPORT_MAX_NODES" in err.message and err.node_id == "1"


def test_subgraphs_nested_past_the_depth_limit_are_refused_before_expanding():
    err = refused_within(bomb(20, 1), 2_000)
    assert err.code == "too_large" and "INLINE_IMPORT_MAX_DEPTH" in err.message


def test_a_subgraph_that_holds_itself_is_refused():
    doc = {"nodes": [{"id": 1, "type": "loop"}], "links": [], "definitions": {"subgraphs": [
        {"id": "loop", "name": "loop", "nodes": [{"id": 1, "type": "loop"}]}]}}
    err = refused_within(doc, 2_000)
    assert err.code == "too_large" and "holds itself" in err.message


@override_settings(INLINE_IMPORT_MAX_NODES=50)
def test_the_node_limit_is_a_setting_and_bounds_the_api_format_too():
    prompt = {str(i): {"class_type": "Note", "inputs": {}} for i in range(51)}
    err = refused_within(prompt, 5_000)
    assert err.code == "too_large" and "51 nodes" in err.message
    assert refused_within(bomb(2, 8), 2_000).code == "too_large"  # 8 + 64 + boundaries > 50


@override_settings(INLINE_IMPORT_MAX_DEPTH=2)
def test_the_depth_limit_is_a_setting():
    assert refused_within(bomb(3, 1), 2_000).code == "too_large"


@override_settings(INLINE_IMPORT_MAX_NODES=10_000)
def test_a_workflow_just_under_the_limits_expands_in_time_linear_in_its_size():
    """Twice the instances, twice the work: the flattening no longer rescans every node added
    so far for each instance (which made it quadratic: 4× the work, ~2 s at 9,666 nodes)."""
    one, refused = importer_lines(bomb(3, 10, copies=1))
    assert refused is not None and refused.code == "no_output"  # after the full expansion
    two, _ = importer_lines(bomb(3, 10, copies=2))
    assert 1.8 < two / one < 2.3, (one, two)


def test_real_workflows_import_within_the_default_limits():
    assert comfy_import(workflow=workflow("z_image_turbo.ui.json"), catalog=CATALOG).target
    assert comfy_import(workflow=turbo_ui().doc(), catalog=CATALOG).target


def test_a_workflow_nested_past_any_real_one_is_unreadable_not_a_crash():
    for depth in (100, 100_000):
        with pytest.raises(ImportInvalid) as err:
            workflow_parse("[" * depth + "]" * depth)
        assert err.value.code == "not_json" and "nests deeper" in err.value.message
