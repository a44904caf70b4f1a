"""The executor: runs a claimed run's target closure in topological order.

Cheap nodes run inline; node outputs are cached per worker (LRU) under a Merkle key of node type
+ params + the keys of its inputs, so a repeated sub-graph is not recomputed. Cancellation (and
loss of the lease) is checked between nodes and, through `ctx.progress`, between steps.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from PIL import Image, PngImagePlugin

from apps.graphs.registry import descriptor_get
from apps.graphs.schema import GraphDoc, NodeSpec
from apps.graphs.validation import closure_order
from apps.runs.events import run_event_append
from apps.runs.services import Claim, run_is_current
from apps.takes.services import take_create
from apps.takes.wire import take_to_wire
from workers.runners import RUNNERS, NodeContext, NodeFailed, RunCancelled

log = logging.getLogger(__name__)

UNCACHED_CATEGORIES = {"loaders"}  # models are cached by file hash in their own loaders


class NodeCache:
    """A small LRU of node outputs, shared by the runs one worker process executes."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[str, tuple[dict[str, Any], dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
        with self._lock:
            if key not in self._items:
                return None
            self._items.move_to_end(key)
            return self._items[key]

    def put(self, key: str, outputs: dict[str, Any], lineage: dict[str, Any]) -> None:
        if self.size <= 0:
            return
        with self._lock:
            self._items[key] = (outputs, lineage)
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)


@dataclass
class Outcome:
    """How an attempt ended: `succeeded`, `failed` (with error) or `cancelled`."""

    status: str
    error: dict[str, str] | None = None
    takes: list[dict[str, Any]] = field(default_factory=list)


class CancelCheck:
    """`check()` raises RunCancelled once the run is no longer ours (cancelled, reaped).

    A fenced event append that just succeeded already proved ownership (`confirm()`), so a check
    right after it skips its own query: a sampler pays one round trip per step, not two.
    """

    FRESH_SECONDS = 0.05

    def __init__(self, claim: Claim) -> None:
        self.claim = claim
        self.lost = threading.Event()
        self._confirmed_at = float("-inf")

    def confirm(self) -> None:
        self._confirmed_at = time.monotonic()

    def check(self) -> None:
        if self.lost.is_set():
            raise RunCancelled(f"run {self.claim.run_id} is no longer ours")
        if time.monotonic() - self._confirmed_at < self.FRESH_SECONDS:
            return
        if not run_is_current(run_id=self.claim.run_id, attempt=self.claim.attempt):
            self.lost.set()
            raise RunCancelled(f"run {self.claim.run_id} is no longer ours")
        self.confirm()


def execute(claim: Claim, *, cache: NodeCache, policy: Any, cancel: CancelCheck) -> Outcome:
    """Run the claim's target closure; never raises for a node's failure (it is the outcome)."""
    doc = GraphDoc.model_validate(claim.document)
    state = _RunState(claim=claim, doc=doc, cache=cache, policy=policy, cancel=cancel)
    try:
        for node_id in closure_order(doc, claim.target):
            cancel.check()
            state.run_node(node_id)
    except RunCancelled:
        return Outcome("cancelled")
    except _NodeError as exc:
        return Outcome("failed", {"code": exc.code, "message": exc.message, "nodeId": exc.node_id})
    return Outcome("succeeded", takes=state.takes)


class _NodeError(Exception):
    def __init__(self, code: str, message: str, node_id: str) -> None:
        super().__init__(message)
        self.code, self.message, self.node_id = code, message, node_id


@dataclass
class _RunState:
    claim: Claim
    doc: GraphDoc
    cache: NodeCache
    policy: Any
    cancel: CancelCheck
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)
    lineage: dict[str, dict[str, Any]] = field(default_factory=dict)
    takes: list[dict[str, Any]] = field(default_factory=list)

    def run_node(self, node_id: str) -> None:
        spec = self.doc.nodes[node_id]
        descriptor = descriptor_get(spec.type)
        assert descriptor is not None  # validated at submit
        self.keys[node_id] = key = node_key(spec, self.keys)
        upstream = _merge(self.lineage[ref.node] for ref in spec.inputs.values())
        cacheable = not descriptor.produces_takes and descriptor.category not in UNCACHED_CATEGORIES
        hit = self.cache.get(key) if cacheable else None
        started = time.perf_counter()
        if hit is not None:
            outputs, own = hit
            takes: list[dict[str, Any]] = []
        else:
            outputs, own, takes = self._compute(node_id, spec, upstream)
            if cacheable:
                self.cache.put(key, outputs, own)
        self.outputs[node_id] = outputs
        self.lineage[node_id] = {**upstream, **own}
        self.takes.extend(takes)
        self._append("node_done", {
            "nodeId": node_id, "nodeType": spec.type, "cached": hit is not None, "takes": takes,
            "ms": round((time.perf_counter() - started) * 1000, 1),
        })

    def _compute(
        self, node_id: str, spec: NodeSpec, upstream: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
        ctx = NodeContext(
            run_id=self.claim.run_id, node_id=node_id, node_type=spec.type,
            graph_sha256=self.claim.graph_sha256, models_dir=Path(settings.INLINE_MODELS_DIR),
            owner_id=self.claim.owner_id, policy=self.policy, check_cancelled=self.cancel.check,
            report_progress=lambda step, total, preview: self._progress(node_id, step, total, preview),
        )
        inputs = {name: self.outputs[ref.node][ref.port] for name, ref in spec.inputs.items()}
        try:
            outputs = RUNNERS[spec.type](ctx, dict(spec.params), inputs)
        except (RunCancelled, _NodeError):
            raise
        except NodeFailed as exc:
            raise _NodeError("node_failed", f"{spec.type}: {exc}", node_id) from None
        except Exception as exc:
            log.exception("node %s (%s) of run %s raised", node_id, spec.type, self.claim.run_id)
            raise _NodeError(
                "node_failed", f"{spec.type}: {type(exc).__name__}: {exc}", node_id
            ) from None
        lineage = {**upstream, **ctx.lineage}
        takes = [self._keep(node_id, spec, i, t.image, {**lineage, **t.metadata})
                 for i, t in enumerate(ctx.takes)]
        return outputs, ctx.lineage, takes

    def _keep(self, node_id: str, spec: NodeSpec, index: int, image: Image.Image,
              facts: dict[str, Any]) -> dict[str, Any]:
        self.cancel.check()  # a cancelled run keeps no new takes
        lineage = {"graphSha256": self.claim.graph_sha256, "nodeType": spec.type, **facts}
        data = png_bytes(image, lineage)
        seed = lineage.get("seed")
        take = take_create(
            run_id=self.claim.run_id, owner_id=self.claim.owner_id, node_id=node_id, index=index,
            data=data, media_type="image/png", width=image.width, height=image.height,
            seed=seed if isinstance(seed, int) else None, lineage=lineage,
        )
        return take_to_wire(take)

    def _progress(self, node_id: str, step: int, total: int, preview: bytes | None) -> None:
        payload: dict[str, Any] = {"nodeId": node_id, "step": step, "total": total}
        if preview:
            import base64

            payload["preview"] = "data:image/png;base64," + base64.b64encode(preview).decode()
        self._append("progress", payload)

    def _append(self, type: str, payload: dict[str, Any]) -> None:
        """Log an event for our attempt; once the run is no longer ours, stop (RunCancelled)."""
        if run_event_append(run_id=self.claim.run_id, type=type, payload=payload,
                            fence_attempt=self.claim.attempt) is None:
            self.cancel.lost.set()
            raise RunCancelled(f"run {self.claim.run_id} is no longer ours")
        self.cancel.confirm()


def node_key(spec: NodeSpec, keys: dict[str, str]) -> str:
    """Merkle key of a node: its type, params, and the keys + ports of what feeds it."""
    body = {
        "type": spec.type,
        "params": spec.params,
        "inputs": {name: [keys[ref.node], ref.port] for name, ref in sorted(spec.inputs.items())},
    }
    blob = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def png_bytes(image: Image.Image, lineage: dict[str, Any]) -> bytes:
    """PNG-encode `image` with the generation parameters in an `inline-farm` text chunk."""
    info = PngImagePlugin.PngInfo()
    info.add_text("inline-farm", json.dumps(lineage, sort_keys=True, default=str))
    out = io.BytesIO()
    image.save(out, format="PNG", pnginfo=info)
    return out.getvalue()


def _merge(parts: Any) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = {**merged[key], **value}
            else:
                merged[key] = value
    return merged
