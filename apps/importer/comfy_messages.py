"""A run's durable events (apps/runs/events.py) as the messages ComfyUI's `/ws` sends.

Pure: no sockets, no ORM. `PromptMessages.of(event)` turns one logged event of the prompt's run
into ComfyUI messages, in the order ComfyUI sends them:

    status(running)       → execution_start
    progress              → executing (first time for the node), progress, a binary preview
    node_done cached      → execution_cached {nodes: [id]}
    node_done             → executing (if not yet), executed {output: {images}} when it kept takes,
                            executed {output: {text: [text]}} when it showed a value (PreviewAny)
    run_done succeeded    → execution_success, then executing {node: null}
    run_done failed       → execution_error, then executing {node: null}
    run_done cancelled    → execution_interrupted, then executing {node: null}

A message is a dict (`{"type", "data"}`, sent as a JSON text frame) or bytes (a binary preview
frame: big-endian event type 1 = PREVIEW_IMAGE, image type 2 = PNG, then the image).
"""

from __future__ import annotations

import base64
import struct
from typing import Any

from apps.importer.comfy_shapes import error_body, image_ref_of_wire, interrupted_body, now_ms

Message = dict[str, Any] | bytes

PREVIEW_IMAGE, PNG = 1, 2


def status_message(queue_remaining: int, sid: str | None = None) -> dict[str, Any]:
    """ComfyUI's `status` broadcast (with `sid` on the first one a client gets)."""
    data: dict[str, Any] = {"status": {"exec_info": {"queue_remaining": queue_remaining}}}
    if sid is not None:
        data["sid"] = sid
    return {"type": "status", "data": data}


class PromptMessages:
    """The ComfyUI messages of one prompt, fed its run's events in seq order."""

    def __init__(self, *, prompt_id: str, workflow: dict[str, Any]) -> None:
        self.prompt_id = prompt_id
        self.classes = {str(k): str(v.get("class_type", "")) for k, v in workflow.items()
                        if isinstance(v, dict)}
        self.started = False
        self.executing: str | None = None
        self.executed: list[str] = []
        self.finished = False

    def of(self, event: dict[str, Any]) -> list[Message]:
        handler = getattr(self, f"_on_{event.get('type')}", None)
        return handler(event) if handler is not None and not self.finished else []

    def _msg(self, type: str, **data: Any) -> dict[str, Any]:
        return {"type": type, "data": {**data, "prompt_id": self.prompt_id}}

    def _on_status(self, event: dict[str, Any]) -> list[Message]:
        if event.get("status") != "running" or self.started:
            return []
        self.started = True
        return [self._msg("execution_start", timestamp=now_ms())]

    def _start(self) -> list[Message]:
        """execution_start for a log that never showed `running` (replayed from the middle)."""
        if self.started:
            return []
        self.started = True
        return [self._msg("execution_start", timestamp=now_ms())]

    def _enter(self, node: str) -> list[Message]:
        if self.executing == node:
            return []
        self.executing = node
        return [self._msg("executing", node=node, display_node=node)]

    def _on_progress(self, event: dict[str, Any]) -> list[Message]:
        node = str(event.get("nodeId"))
        out = [*self._start(), *self._enter(node),
               self._msg("progress", value=event.get("step", 0), max=event.get("total", 0),
                         node=node)]
        preview = event.get("preview")
        if isinstance(preview, str) and preview.startswith("data:image/png;base64,"):
            data = base64.b64decode(preview.split(",", 1)[1])
            out.append(struct.pack(">II", PREVIEW_IMAGE, PNG) + data)
        return out

    def _on_node_done(self, event: dict[str, Any]) -> list[Message]:
        node = str(event.get("nodeId"))
        out = self._start()
        self.executed.append(node)
        if event.get("cached"):
            return [*out, self._msg("execution_cached", nodes=[node], timestamp=now_ms())]
        out += self._enter(node)
        takes = event.get("takes") or []
        if takes:
            images = [image_ref_of_wire(t, self.classes.get(node, "")) for t in takes]
            output: dict[str, Any] = {"images": images}
            if any(t.get("frameCount") is not None for t in takes):  # a clip: SaveVideo's shape
                output["animated"] = [True]
            out.append(self._msg("executed", node=node, display_node=node, output=output))
        value = event.get("value")
        if isinstance(value, dict) and isinstance(value.get("text"), str):
            out.append(self._msg("executed", node=node, display_node=node,
                                 output={"text": [value["text"]]}))
        return out

    def _on_run_done(self, event: dict[str, Any]) -> list[Message]:
        self.finished = True
        out = self._start()
        status, err = event.get("status"), event.get("error") or {}
        node = err.get("nodeId") or self.executing
        class_type = self.classes.get(str(node), "") if node else ""
        if status == "succeeded":
            out.append(self._msg("execution_success", timestamp=now_ms()))
        elif status == "cancelled":
            out.append({"type": "execution_interrupted", "data": interrupted_body(
                self.prompt_id, node, class_type, list(self.executed), now_ms())})
        else:
            out.append({"type": "execution_error", "data": error_body(
                self.prompt_id, node, class_type, err.get("code", "failed"),
                err.get("message", ""), list(self.executed), now_ms())})
        self.executing = None
        out.append(self._msg("executing", node=None, display_node=None))
        return out
