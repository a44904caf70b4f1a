"""Import a ComfyUI workflow (UI or API format) as our typed graph, validated, with a report."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings

from apps.graphs.schema import GraphDoc
from apps.graphs.validation import GraphInvalid, graph_validate
from apps.importer.api_format import AssetResolver, FileFamilies, prompt_to_graph
from apps.importer.report import ImportInvalid, Report
from apps.importer.ui_format import Bounds, workflow_to_prompt
from inline_farm.jsondoc import JsonUnreadable, json_parse


@dataclass(frozen=True)
class Imported:
    """A validated graph (defaults filled in), its target node and what happened to each node;
    `prompt` is the workflow in ComfyUI's API format (a UI workflow once flattened)."""

    graph: GraphDoc
    target: str
    report: Report
    prompt: dict[str, Any]

    def to_wire(self) -> dict[str, Any]:
        return {"graph": self.graph.model_dump(mode="json"), "target": self.target,
                "report": self.report.to_wire()}


def workflow_parse(raw: bytes | str) -> Any:
    """The JSON document of an upload; ImportInvalid(not_json) when it is not JSON, or nests
    deeper than any workflow does (the rule /v1 bodies follow: inline_farm/jsondoc.py)."""
    try:
        return json_parse(raw)
    except JsonUnreadable as exc:
        raise ImportInvalid("not_json", f"the workflow is unreadable: {exc}") from None


def comfy_import(
    *, workflow: Any, catalog: dict[str, list[str]], resolve_asset: AssetResolver | None = None,
    files: FileFamilies | None = None,
) -> Imported:
    """Map `workflow` onto our graph and validate it. `catalog`: models folder → names the
    fleet holds (model names resolve against it; a name nobody holds is reported, not refused).
    `resolve_asset`: LoadImage file names → the caller's asset ids (see `prompt_to_graph`).
    `files`: (folder, name) → the families of each held file (apps/fleet/selectors.py
    `model_catalog_families`): a workflow for a family the farm does not run is refused.

    Raises ImportInvalid (with `.report` set) when the result cannot run: not a workflow, no
    output, a dangling link, an output that needs an unmapped node, or an invalid graph.
    """
    report = Report()
    try:
        try:
            prompt = _prompt_of(workflow, report)
            graph, target = prompt_to_graph(prompt, catalog=catalog, report=report,
                                            resolve_asset=resolve_asset, files=files)
        except (AttributeError, IndexError, KeyError, TypeError, ValueError) as exc:
            # A hand-edited or truncated file: say so instead of answering a 500.
            raise ImportInvalid("bad_workflow", f"the workflow is malformed ({type(exc).__name__}:"
                                f" {exc})") from None
        try:
            graph = graph_validate(graph, target=target, max_nodes=settings.INLINE_MAX_GRAPH_NODES)
        except GraphInvalid as exc:
            raise ImportInvalid(exc.code, exc.message, exc.node_id) from None
    except ImportInvalid as exc:
        exc.report = report
        raise
    return Imported(graph, target, report, prompt)


def _prompt_of(workflow: Any, report: Report) -> dict[str, Any]:
    """The API prompt of either format (also `{"prompt": …}` as ComfyUI's /prompt takes it),
    bounded by INLINE_IMPORT_MAX_NODES / _DEPTH before any node is read."""
    bounds = Bounds(nodes=settings.INLINE_IMPORT_MAX_NODES, depth=settings.INLINE_IMPORT_MAX_DEPTH)
    if isinstance(workflow, dict) and isinstance(workflow.get("prompt"), dict):
        workflow = workflow["prompt"]
    if isinstance(workflow, dict) and isinstance(workflow.get("nodes"), list):
        report.format = "ui"
        return workflow_to_prompt(workflow, report, bounds)
    if isinstance(workflow, dict) and workflow and all(
        isinstance(v, dict) and "class_type" in v for v in workflow.values()
    ):
        report.format = "api"
        if len(workflow) > bounds.nodes:
            raise ImportInvalid("too_large", f"the workflow has {len(workflow)} nodes; the limit "
                                f"is {bounds.nodes} (INLINE_IMPORT_MAX_NODES)")
        return workflow
    raise ImportInvalid(
        "not_a_workflow",
        "expected a ComfyUI workflow: the UI format ({nodes: [...], links: [...]}) or the API "
        "format ({id: {class_type, inputs}})",
    )
