"""ComfyUI's JSON shapes for the front door: validation errors, history, queue, images.

Shapes follow ComfyUI's server.py and execution.py: an error is
`{type, message, details, extra_info}`; a refused prompt answers
`{error, node_errors: {node_id: {errors: [error], dependent_outputs, class_type}}}`.
"""

from __future__ import annotations

import re
import time
from typing import Any
from urllib.parse import urlencode

from apps.importer.comfy_families import known_family_node
from apps.importer.comfy_nodes import CUT, FOLDED, NOTE_TYPES, RULES, UNSUPPORTED
from apps.importer.report import ImportInvalid

ErrorShape = dict[str, Any]


class ComfyRefused(Exception):
    """A prompt ComfyUI's way refuses it: HTTP `status`, `error`, and `node_errors`."""

    def __init__(self, status: int, error: ErrorShape,
                 node_errors: dict[str, Any] | None = None) -> None:
        super().__init__(error["message"])
        self.status, self.error, self.node_errors = status, error, node_errors or {}

    def body(self) -> dict[str, Any]:
        return {"error": self.error, "node_errors": self.node_errors}


def error(type: str, message: str, details: str = "", **extra: Any) -> ErrorShape:
    return {"type": type, "message": message, "details": details, "extra_info": extra}


def now_ms() -> int:
    return int(time.time() * 1000)


def known_type(class_type: str) -> bool:
    """Whether the importer knows `class_type` at all (mapped, folded, cut or refused; a node
    of one model family: the import names the family when the farm does not run it)."""
    return (class_type in RULES or class_type in FOLDED or class_type in CUT
            or class_type in NOTE_TYPES or class_type in UNSUPPORTED
            or known_family_node(class_type))


def class_of(prompt: dict[str, Any], node_id: str | None) -> str:
    node = prompt.get(node_id) if node_id is not None else None
    return str(node.get("class_type", "")) if isinstance(node, dict) else ""


# --- refusals ---------------------------------------------------------------------------------

_NO_NODE = {
    "no_output": ("prompt_no_outputs", "Prompt has no outputs"),
}


def unknown_refusal(prompt: dict[str, Any]) -> ComfyRefused | None:
    """ComfyUI refuses a prompt naming a node type it does not have, wherever the node is
    (`invalid_prompt`); so does the farm, and `node_errors` names the node too."""
    untyped = _first_untyped(prompt)
    if untyped is not None:
        return untyped
    unknown = _first_unknown(prompt)
    if unknown is None:
        return None
    node_id, class_type = unknown
    entry = error("invalid_prompt", f"Cannot execute because node {class_type} does not exist.",
                  f"Node ID '#{node_id}'")
    return ComfyRefused(400, entry, {node_id: _node_error(
        class_type, [error("unknown_node_type", f"Node {class_type} does not exist on this farm",
                           node_id, class_type=class_type)], [])})


def import_refusal(exc: ImportInvalid, prompt: dict[str, Any]) -> ComfyRefused:
    """An importer refusal as ComfyUI words it: a node that fails is
    `prompt_outputs_failed_validation` with its entry in `node_errors`."""
    if exc.node_id is None or exc.node_id not in prompt:
        kind, message = _NO_NODE.get(exc.code, ("invalid_prompt", "Invalid prompt"))
        return ComfyRefused(400, error(kind, message, exc.message))
    return node_refusal(exc.code, exc.message, exc.node_id, prompt, [])


def submit_refusal(exc: Exception, prompt: dict[str, Any], target: str) -> ComfyRefused:
    """What run_submit refused (a missing input image or model, a limit), ComfyUI's way."""
    code = getattr(exc, "code", "")
    node_id = getattr(exc, "node_id", None)
    if code and node_id:
        return node_refusal(code, str(exc), node_id, prompt, [target])
    kind = {"RunLimitReached": "queue_full", "RunPriorityNotAllowed": "priority_not_allowed"}.get(
        type(exc).__name__, "invalid_prompt")
    return ComfyRefused(429 if kind == "queue_full" else 400, error(kind, str(exc), str(exc)))


def node_refusal(code: str, message: str, node_id: str, prompt: dict[str, Any],
                 outputs: list[str]) -> ComfyRefused:
    class_type = class_of(prompt, node_id)
    entry = _node_entry(code, message, class_type)
    top = error("prompt_outputs_failed_validation", "Prompt outputs failed validation",
                f"{entry['message']}: {entry['details']}")
    return ComfyRefused(400, top, {node_id: _node_error(class_type, [entry], outputs)})


def unmapped_node_errors(unmapped: list[dict[str, Any]]) -> dict[str, Any]:
    """`node_errors` of an accepted prompt: the nodes the importer left out, and why."""
    return {u["id"]: _node_error(u["type"], [error("unmapped_node", u["reason"], u["id"])], [])
            for u in unmapped}


def _node_error(class_type: str, errors: list[ErrorShape], outputs: list[str]) -> dict[str, Any]:
    return {"errors": errors, "dependent_outputs": outputs, "class_type": class_type}


def _first_untyped(prompt: dict[str, Any]) -> ComfyRefused | None:
    """A node sent without a class_type: what ComfyUI's editor sends for a node whose type it
    does not have (a custom node missing here). ComfyUI answers `missing_node_type` naming the
    node's title; so does the farm, with the node in `node_errors` too."""
    for node_id, node in prompt.items():
        # An API node always has `inputs` (a UI-format workflow's other keys do not count).
        if isinstance(node, dict) and "inputs" in node and not isinstance(node.get("class_type"), str):
            meta = node.get("_meta")
            title = meta.get("title") if isinstance(meta, dict) else None
            name = title if isinstance(title, str) and title else f"#{node_id}"
            message = (f"Node '{name}' has no class_type. The workflow may be corrupted or a "
                       "custom node is missing.")
            entry = error("missing_node_type", message, f"Node ID '#{node_id}'",
                          node_id=str(node_id), class_type=None, node_title=title)
            return ComfyRefused(400, entry, {str(node_id): _node_error("", [error(
                "missing_node_type", f"{name} is not a node type this farm runs", str(node_id))],
                [])})
    return None


def _first_unknown(prompt: dict[str, Any]) -> tuple[str, str] | None:
    for node_id, node in prompt.items():
        class_type = node.get("class_type") if isinstance(node, dict) else None
        if isinstance(class_type, str) and not known_type(class_type):
            return str(node_id), class_type
    return None


_QUOTED = re.compile(r"'([^']+)'")


def _node_entry(code: str, message: str, class_type: str) -> ErrorShape:
    """One of our validation codes as the ComfyUI error of the input it concerns."""
    name = _comfy_input(class_type, _QUOTED.search(message))
    if code in ("missing_input", "missing_param"):
        return error("required_input_missing", "Required input is missing", name or message,
                     input_name=name)
    if code == "asset_not_found":
        return error("custom_validation_failed", "Custom validation failed for node",
                     f"{name or 'image'} - Invalid image file: {message}", input_name=name or "image")
    if code in ("model_not_found", "param_choice"):
        return error("value_not_in_list", "Value not in list", f"{name}: {message}",
                     input_name=name)
    if code == "param_range":
        return error("value_out_of_range", "Value out of range", f"{name}: {message}",
                     input_name=name)
    if code == "param_type":
        return error("invalid_input_type", "Invalid input type", f"{name}: {message}",
                     input_name=name)
    if code == "unmapped_node":
        return error("unmapped_node", f"{class_type} cannot run on this farm", message)
    if code == "unsupported_family":  # the family, not an input, is what the farm lacks
        return error("unsupported_family", message, message)
    return error(code, message, message, input_name=name)


def _comfy_input(class_type: str, match: re.Match[str] | None) -> str:
    """ComfyUI's name for the port or param that one of our messages quotes."""
    if match is None:
        return ""
    ours = match.group(1)
    rule = RULES.get(class_type)
    if rule is None:
        return ours
    for comfy, port in rule.inputs.items():
        if port == ours:
            return comfy
    for comfy, mapping in rule.params.items():
        if mapping.name == ours:
            return comfy
    return ours


# --- history, queue, images -------------------------------------------------------------------

_SUFFIXES = {"image/webp": ".webp", "image/jpeg": ".jpg", "video/mp4": ".mp4",
             "video/webm": ".webm"}  # else .png (the takes' default)


def image_ref(take: Any, class_type: str) -> dict[str, str]:
    """How ComfyUI names an output image; /view finds the take by its id in `filename` (the
    suffix follows the take's format: SaveImage's PNG, image/save's WebP or JPEG)."""
    kind = "temp" if class_type == "PreviewImage" else "output"
    suffix = _SUFFIXES.get(take.media_type, ".png")
    return {"filename": f"{take.id}{suffix}", "subfolder": "", "type": kind}


def take_url(base: str, ref: dict[str, str]) -> str:
    """The bytes of an output (`image_ref`) at the door `base` the caller reached the farm by
    (`/comfy/api/`, `/comfy/k/<key>/`, …): a link that works with the caller's own credential.
    The editor opens a result item's `url` when it has one (resultItemUrl in the frontend)."""
    return f"{base}view?{urlencode(ref)}"


def image_ref_of_wire(take: dict[str, Any], class_type: str) -> dict[str, str]:
    kind = "temp" if class_type == "PreviewImage" else "output"
    suffix = _SUFFIXES.get(take.get("mediaType", ""), ".png")
    return {"filename": f"{take['id']}{suffix}", "subfolder": "", "type": kind}


def queue_item(prompt: Any) -> list[Any]:
    """ComfyUI's queue entry: [number, prompt_id, prompt, extra_data, outputs_to_execute]."""
    return [prompt.number, str(prompt.id), prompt.prompt, prompt.extra_data, prompt.outputs]


def history_entry(prompt: Any, base: str | None = None) -> dict[str, Any]:
    """One finished prompt as `/history` lists it (its run's takes are prefetched); with the
    door's `base`, each output also carries its `url` (`take_url`) and the entry its run
    (`farm`: the run's id and its takes, each with its id and url)."""
    run = prompt.run
    outputs: dict[str, dict[str, list[Any]]] = {}
    takes = []
    for take in run.takes.all():
        output = outputs.setdefault(take.node_id, {"images": []})
        ref: dict[str, Any] = image_ref(take, class_of(prompt.prompt, take.node_id))
        if base is not None:
            ref = {**ref, "url": take_url(base, ref)}
            takes.append({"id": str(take.id), "node_id": take.node_id,
                          "media_type": take.media_type, "url": ref["url"]})
        output["images"].append(ref)
        if take.frame_count is not None:  # ComfyUI's SaveVideo / SaveAnimatedWEBP ui output
            output["animated"] = [True]
    for shown in run.shown_values or []:  # PreviewAny: its text, as ComfyUI's ui output
        outputs.setdefault(shown["nodeId"], {}).setdefault("text", []).append(shown["text"])
    pid = str(prompt.id)
    started = _ms(run.started_at or run.created_at)
    messages: list[list[Any]] = [["execution_start", {"prompt_id": pid, "timestamp": started}],
                                 ["execution_cached", {"nodes": [], "prompt_id": pid,
                                                       "timestamp": started}]]
    end = _ms(run.finished_at) if run.finished_at else now_ms()
    if run.status == "succeeded":
        messages.append(["execution_success", {"prompt_id": pid, "timestamp": end}])
    elif run.status == "cancelled":
        messages.append(["execution_interrupted", interrupted_body(
            pid, run.error_node or None, class_of(prompt.prompt, run.error_node), [], end)])
    else:
        messages.append(["execution_error", error_body(
            pid, run.error_node or None, class_of(prompt.prompt, run.error_node),
            run.error_code, run.error_message, [], end)])
    entry = {
        "prompt": queue_item(prompt),
        "outputs": outputs,
        "status": {"status_str": "success" if run.status == "succeeded" else "error",
                   "completed": run.status == "succeeded", "messages": messages},
        "meta": {node: {"node_id": node, "display_node": node, "parent_node": None,
                        "real_node_id": node} for node in outputs},
    }
    if base is not None:
        entry["farm"] = {"run_id": str(run.pk), "takes": takes}
    return entry


def error_body(prompt_id: str, node_id: str | None, class_type: str, code: str, message: str,
               executed: list[str], timestamp: int) -> dict[str, Any]:
    """The data of ComfyUI's `execution_error` message."""
    return {"prompt_id": prompt_id, "node_id": node_id, "node_type": class_type,
            "executed": executed, "exception_message": message, "exception_type": code,
            "traceback": [], "current_inputs": {}, "current_outputs": {}, "timestamp": timestamp}


def interrupted_body(prompt_id: str, node_id: str | None, class_type: str, executed: list[str],
                     timestamp: int) -> dict[str, Any]:
    """The data of ComfyUI's `execution_interrupted` message."""
    return {"prompt_id": prompt_id, "node_id": node_id, "node_type": class_type,
            "executed": executed, "timestamp": timestamp}


def _ms(value: Any) -> int:
    return int(value.timestamp() * 1000)
